"""SM assignment: per-SM instruction queues, each consistent with the program's one global
topological order (tasks are appended in program order). Strategies are chosen by name."""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable

import numpy as np

from megavm.instructions import Op
from megavm.schedule.ir import Program, Task


@dataclass(frozen=True)
class CostModel:
    """Estimated time of a task on one SM, in nanoseconds: the hand-written defaults, or per opcode
    (name, overhead ns, bytes per ns) as fitted from a traced run (flywheel/costfit.py), with the
    time from a counter's last signal to its waiter's start (handoff_ns)."""
    bytes_per_ns: float = 22.0       # one SM's share of HBM bandwidth
    flops_per_ns: float = 4000.0
    overhead_ns: float = 600.0       # wait, dispatch, signal
    per_op: tuple = ()               # ((opcode name, overhead_ns, bytes_per_ns), ...)
    handoff_ns: float = 0.0

    @staticmethod
    def of(table) -> "CostModel":
        """A fitted table (ScheduleConfig.cost: [[name, overhead_ns, bytes_per_ns], ...] and optionally
        ["handoff", ns, 0]) -> its CostModel; () -> the defaults."""
        rows = tuple((str(n), float(a), float(b)) for n, a, b in table)
        handoff = next((a for n, a, _ in rows if n == "handoff"), 0.0)
        return CostModel(per_op=tuple(r for r in rows if r[0] != "handoff"), handoff_ns=handoff)

    def task_ns(self, est_bytes: int, est_flops: int, opcode: int | None = None) -> float:
        fitted = _by_opcode(self.per_op).get(opcode) if self.per_op else None
        if fitted is not None:
            overhead, bpn = fitted
            return max(est_bytes / bpn, est_flops / self.flops_per_ns) + overhead
        return max(est_bytes / self.bytes_per_ns, est_flops / self.flops_per_ns) + self.overhead_ns


@functools.lru_cache(maxsize=16)
def _by_opcode(per_op: tuple) -> dict[int, tuple[float, float]]:
    names = {op.name: int(op) for op in Op}
    return {names[n]: (a, b) for n, a, b in per_op if n in names}


def round_robin(program: Program, n_sms: int, cost: CostModel = CostModel()) -> list[list[int]]:
    queues: list[list[int]] = [[] for _ in range(n_sms)]
    for k, i in enumerate(i for i, t in enumerate(program.tasks) if not t.inline):
        queues[k % n_sms].append(i)
    return queues


def balanced(program: Program, n_sms: int, cost: CostModel = CostModel()) -> list[list[int]]:
    """Earliest-finish list scheduling in program order: each task goes to the SM where, given
    when its counters are expected to be satisfied, it would finish first (ties: least loaded).
    Counter ids outside the program are passed over (the validator names them)."""
    queues: list[list[int]] = [[] for _ in range(n_sms)]
    free = np.zeros(n_sms)
    nc = len(program.counters)
    counter_done = np.zeros(nc)
    last_sm = np.zeros(nc, dtype=np.int64)                  # the SM of a counter's latest signal
    for i, t in enumerate(program.tasks):
        if t.inline:        # after its last signaller, on that SM, with no hand-off
            c = t.waits[0].counter if t.waits and 0 <= t.waits[0].counter < nc else -1
            sm = int(last_sm[c]) if c >= 0 else 0
            start_at = max(free[sm], counter_done[c] if c >= 0 else 0.0)
            finish = start_at + cost.task_ns(t.est_bytes, t.est_flops, t.opcode)
        else:
            ready = max((counter_done[w.counter] + cost.handoff_ns for w in t.waits if 0 <= w.counter < nc),
                        default=0.0)
            start = np.maximum(free, ready)
            sm = int(np.argmin(start))
            finish = start[sm] + cost.task_ns(t.est_bytes, t.est_flops, t.opcode)
            queues[sm].append(i)
        free[sm] = finish
        if 0 <= t.signal < nc and finish >= counter_done[t.signal]:
            counter_done[t.signal], last_sm[t.signal] = finish, sm
    return queues


STRATEGIES: dict[str, Callable[..., list[list[int]]]] = {"balanced": balanced, "round_robin": round_robin}
# The decoders' default since session 37: round robin in program order took every preset measured on the
# H100 1.4-6.5% faster than the balanced list scheduling under the hand-written costs (docs/performance.md).
DEFAULT_STRATEGY = "round_robin"


def assign(program: Program, n_sms: int, strategy: str = DEFAULT_STRATEGY, cost: CostModel = CostModel()) -> list[list[int]]:
    if n_sms < 1:
        raise ValueError(f"n_sms={n_sms} must be >= 1")
    try:
        fn = STRATEGIES[strategy]
    except KeyError:
        raise ValueError(f"unknown assignment strategy {strategy!r}; choose from {sorted(STRATEGIES)}") from None
    return fn(program, n_sms, cost)


def crowded_partials(program: Program, queues: list[list[int]]) -> tuple[int, int]:
    """(attention partials queued right behind a task of their own layer's q/k/v stage, layers where that
    happens). Such a partial starts, and begins its pre-wait work, only when that task ends. In session 41's
    q tile sweeps on the H100, the configurations with many of them (llama-1b at 8 and 10 q tiles a KV
    head, small at 23, gemma-2b at 106, qwen2.5-1.5b at 50) ran 1.5-10% slower than those with few or none
    (docs/performance.md)."""
    n, layers = 0, set()
    for queue in queues:
        for a, b in zip(queue, queue[1:]):
            ta, tb = program.tasks[a], program.tasks[b]
            layer = tb.label.split(".", 1)[0]
            if (tb.opcode == Op.ATTN_PARTIAL and ta.opcode not in (Op.ATTN_PARTIAL, Op.ATTN_COMBINE)
                    and ta.label.split(".", 1)[0] == layer):
                n += 1
                layers.add(layer)
    return n, len(layers)


def predicted_ns(program: Program, queues: list[list[int]], cost: CostModel = CostModel()) -> float:
    """Makespan of the queues under the cost model (queues run in order, waits respected; an inline
    task runs on the queue of its counter's last signal, right after it)."""
    pos = [0] * len(queues)
    free = [0.0] * len(queues)
    done = [0.0] * len(program.counters)
    left = [0] * len(program.counters)
    for t in program.tasks:
        if t.signal >= 0:
            left[t.signal] += 1
    inline = program.inline_of()

    def signal(t: Task, q: int) -> None:
        if t.signal < 0:
            return
        left[t.signal] -= 1
        done[t.signal] = max(done[t.signal], free[q])
        if left[t.signal] == 0 and t.signal in inline:
            u = program.tasks[inline[t.signal]]
            free[q] += cost.task_ns(u.est_bytes, u.est_flops, u.opcode)
            signal(u, q)
    progress = True
    while progress:
        progress = False
        for q, queue in enumerate(queues):
            while pos[q] < len(queue):
                t = program.tasks[queue[pos[q]]]
                if any(left[w.counter] > 0 for w in t.waits):
                    break
                start = max([free[q]] + [done[w.counter] + cost.handoff_ns for w in t.waits])
                free[q] = start + cost.task_ns(t.est_bytes, t.est_flops, t.opcode)
                signal(t, q)
                pos[q] += 1
                progress = True
    return max(free)
