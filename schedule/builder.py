"""The lowering's task builder (schedule/lower.py, schedule/lower_moe.py, schedule/lora_layout.py): tasks whose
operands are named by buffer, and the row tilings the stages share."""
from __future__ import annotations

from megavm.instructions import Op, spec
from megavm.instructions.spec import ABSENT
from megavm.schedule.ir import Program, Task


def even_split(start: int, n: int, parts: int):
    """n rows from start in `parts` tiles of even height (RoPE pairs stay together), sizes within 2."""
    q, r = divmod(n // 2, parts)
    r0 = start
    for i in range(parts):
        rows = 2 * (q + (i < r))
        yield r0, rows
        r0 += rows


def row_tiles(n: int, rows: int):
    """n rows in tiles of `rows` (the last may be shorter): (row0, nrows) each."""
    return [(r, min(rows, n - r)) for r in range(0, n, rows)]


class TaskBuilder:
    """Adds tasks to a program, their operands named by buffer, their cost estimated by their spec."""

    def __init__(self, prog: Program):
        self.p = prog

    def task(self, op: Op, ins, outs, waits, signal, label, inline=False, **params):
        """One task; operands by buffer name, None for an optional slot left empty (trailing optional
        slots may be left out, and params with a default: Task fills them in)."""
        p = self.p
        in_ids = tuple(ABSENT if n is None else p.buffer_id(n) for n in ins)
        out_ids = tuple(ABSENT if n is None else p.buffer_id(n) for n in outs)
        p.add_task(Task(int(op), in_ids, out_ids, tuple(waits), signal, params, label, inline=inline))
        t = p.tasks[-1]
        t.est_bytes, t.est_flops = spec(op).cost(t.params, *p.operands(len(p.tasks) - 1))
