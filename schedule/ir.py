"""The IR: buffers, counters, tasks and the program that holds them.

A task reads its inputs, writes its outputs, waits for (counter, threshold) pairs before it starts
and increments one counter when it is done. An inline task sits in no SM's queue: the task whose
signal completes its one wait runs it next, on its own SM (no hand-off to a task polling elsewhere).
Token id and position are runtime INPUT buffers, so one program serves every decode step. Task order
in `Program.tasks` is the program order; the validator checks that it is a topological order of the
counter graph.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from megavm.core.errors import UserError
from megavm.core.types import Buffer, BufferKind, DType
from megavm.instructions import SPECS, op_name
from megavm.instructions.spec import ABSENT
from megavm.schedule import ir_json
from megavm.schedule.happens import boxes_meet

IR_VERSION = 1
MAX_FILE_BYTES = 1 << 30


@dataclass(frozen=True)
class Counter:
    name: str


@dataclass(frozen=True)
class Wait:
    counter: int
    threshold: int
    polled: bool = False         # met on the GPU by polling the tags of the task's tagged inputs (docs/ir.md)


@dataclass
class Task:
    opcode: int                  # megavm.instructions.Op
    inputs: tuple[int, ...]      # buffer ids, in the order the opcode's spec names them
    outputs: tuple[int, ...]
    waits: tuple[Wait, ...] = ()
    signal: int = -1             # the one counter incremented when done (-1: none)
    params: dict[str, int | float] = field(default_factory=dict)
    label: str = ""
    est_bytes: int = 0
    est_flops: int = 0
    inline: bool = False         # run by the task whose signal completes its one wait (in no queue)

    def __post_init__(self):
        """Optional slots left out at the end of the inputs or outputs are ABSENT, and params left out
        that have a default take it (the opcode's spec says which); anything else a task lacks is left
        for the validator's arity and params rules to name."""
        s = SPECS.get(self.opcode) if isinstance(self.opcode, int) and not isinstance(self.opcode, bool) else None
        if s is None or not isinstance(self.params, dict):
            return
        for io, slots in (("inputs", s.inputs), ("outputs", s.outputs)):
            ids = getattr(self, io)
            if isinstance(ids, tuple) and len(ids) < len(slots) and all(x.optional for x in slots[len(ids):]):
                setattr(self, io, ids + (ABSENT,) * (len(slots) - len(ids)))
        missing = {x.name: x.default for x in s.params if x.default is not None and x.name not in self.params}
        if missing:
            self.params = {**self.params, **missing}


@dataclass
class Program:
    buffers: list[Buffer] = field(default_factory=list)
    counters: list[Counter] = field(default_factory=list)
    tasks: list[Task] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)

    # -- building -------------------------------------------------------------------------------
    def add_buffer(self, name: str, kind: BufferKind, dtype: DType, shape, tagged: bool = False) -> int:
        if name in self._names():
            raise UserError(f"duplicate buffer name {name!r}")
        self.buffers.append(Buffer(name, BufferKind(kind), DType(dtype), tuple(int(s) for s in shape), tagged))
        self._name_index = None
        return len(self.buffers) - 1

    def add_counter(self, name: str) -> int:
        self.counters.append(Counter(name))
        return len(self.counters) - 1

    def add_task(self, task: Task) -> int:
        self.tasks.append(task)
        return len(self.tasks) - 1

    def _names(self) -> dict[str, int]:
        idx = getattr(self, "_name_index", None)
        if idx is None or len(idx) != len(self.buffers):
            idx = {b.name: i for i, b in enumerate(self.buffers)}
            self._name_index = idx
        return idx

    def buffer_id(self, name: str) -> int:
        try:
            return self._names()[name]
        except KeyError:
            raise KeyError(f"no buffer named {name!r}") from None

    def producers(self) -> list[list[int]]:
        """producers[c]: the tasks that signal counter c."""
        out: list[list[int]] = [[] for _ in self.counters]
        for i, t in enumerate(self.tasks):
            if 0 <= t.signal < len(out):
                out[t.signal].append(i)
        return out

    def inline_of(self) -> dict[int, int]:
        """counter -> the inline task waiting on it (at most one per counter: the validator's inline rule)."""
        return {t.waits[0].counter: i for i, t in enumerate(self.tasks) if t.inline and t.waits}

    def writers(self) -> dict[int, set[int]]:
        """buffer id -> the tasks that write it."""
        out: dict[int, set[int]] = {}
        for i, t in enumerate(self.tasks):
            for b in t.outputs:
                if b >= 0:
                    out.setdefault(b, set()).add(i)
        return out

    def index_wait(self, i: int, b: int, writers: dict[int, set[int]] | None = None,
                   producers: list[list[int]] | None = None) -> int | None:
        """The wait of task i that covers every write of buffer b (the expert ids a late-bound stream
        reads): a full join on a counter that every task writing b signals; None when no wait does.
        The loader reads the ids after that one wait, so the task's other waits do not count.
        (writers and producers, when given, are this program's, computed once by the caller.)"""
        return self._covering_wait(i, (writers if writers is not None else self.writers()).get(b, set()), producers)

    def history_wait(self, i: int, st, writers: dict[int, set[int]] | None = None,
                     producers: list[list[int]] | None = None, outs: dict[int, list] | None = None) -> int | None:
        """The wait of task i that covers every writer of the KV rows its history stream st names (a
        full join on a counter each task writing those rows signals): the loader copies the rows once
        that wait of the step before is met. None when no wait does. (outs, when given, keeps each
        writer's (buffer, box) writes between calls: a caller asking for many streams passes one dict.)"""
        b = self.tasks[i].inputs[st.slot]
        buf = self.buffers[b]
        row = buf.shape[2]
        h, k0 = divmod(st.elem_offset // row, buf.shape[1])
        box = ((h, h + 1), (k0, k0 + st.elem_count // row))
        outs = {} if outs is None else outs
        rows = set()
        for j in (writers if writers is not None else self.writers()).get(b, ()):
            if j not in outs:
                t = self.tasks[j]
                outs[j] = [(t.outputs[a.slot], a.box) for a in SPECS[t.opcode].accesses(t.params, *self.operands(j))
                           if a.io == "out"]
            if any(x == b and boxes_meet(bx, box) for x, bx in outs[j]):     # heads and positions
                rows.add(j)
        return self._covering_wait(i, rows, producers)

    def _covering_wait(self, i: int, w: set[int], producers: list[list[int]] | None) -> int | None:
        prod = producers if producers is not None else self.producers()
        if not w:
            return None
        for k, wt in enumerate(self.tasks[i].waits):
            if 0 <= wt.counter < len(prod) and wt.threshold >= len(prod[wt.counter]) and w <= set(prod[wt.counter]):
                return k
        return None

    def operands(self, i: int) -> tuple[list[Buffer | None], list[Buffer | None]]:
        """Task i's input and output buffers, None where an optional slot is empty (id -1)."""
        t = self.tasks[i]
        return ([self.buffers[b] if b >= 0 else None for b in t.inputs],
                [self.buffers[b] if b >= 0 else None for b in t.outputs])

    def buffers_of_kind(self, kind: BufferKind) -> list[int]:
        return [i for i, b in enumerate(self.buffers) if b.kind == kind]

    def describe_task(self, i: int) -> str:
        t = self.tasks[i]
        return f"task {i} ({t.label or '?'}, {op_name(t.opcode)})"

    # -- persistence ----------------------------------------------------------------------------
    def to_json(self) -> str:
        return json.dumps({
            "megavm_ir": IR_VERSION,
            "meta": self.meta,
            "buffers": [[b.name, b.kind.name, b.dtype.name, list(b.shape)] + (["tagged"] if b.tagged else [])
                        for b in self.buffers],
            "counters": [c.name for c in self.counters],
            "tasks": [{"op": t.opcode, "in": list(t.inputs), "out": list(t.outputs),
                       "waits": [[w.counter, w.threshold] + (["polled"] if w.polled else []) for w in t.waits],
                       "signal": t.signal,
                       "params": t.params, "label": t.label, "bytes": t.est_bytes, "flops": t.est_flops}
                      | ({"inline": True} if t.inline else {}) for t in self.tasks],
        })

    @classmethod
    def from_json(cls, text: str | bytes) -> "Program":
        """Parse a program saved by to_json, strictly (schedule/ir_json.py): UserError names what is
        malformed. Plain JSON only: nothing is executed."""
        d = ir_json.parse(text)
        if not isinstance(d, dict) or "megavm_ir" not in d:
            raise ir_json.Malformed("not a megavm program: missing 'megavm_ir' version field")
        if isinstance(d["megavm_ir"], bool) or d["megavm_ir"] != IR_VERSION:
            raise ir_json.Malformed(f"unsupported megavm IR version {d['megavm_ir']!r}; this megavm reads version "
                                    f"{IR_VERSION}")
        for key in ("buffers", "counters", "tasks"):
            if key not in d:
                raise ir_json.Malformed(f"malformed megavm program: no {key!r}")
        meta = d.get("meta", {})
        if not isinstance(meta, dict):
            raise ir_json.Malformed(f"malformed megavm program: meta is {ir_json._kind(meta)}, not an object")
        p = cls(meta=dict(meta))
        for i, row in enumerate(ir_json.array(d["buffers"], "buffers")):
            b = ir_json.buffer(row, i)
            if b.name in p._names():
                raise ir_json.Malformed(f"malformed megavm program: buffer {i} repeats the name {b.name!r}")
            p.add_buffer(b.name, b.kind, b.dtype, b.shape, b.tagged)
        counters = ir_json.array(d["counters"], "counters")
        p.counters = [Counter(ir_json.text(c, f"counter {i}")) for i, c in enumerate(counters)]
        for i, t in enumerate(ir_json.array(d["tasks"], "tasks")):
            f = ir_json.task(t, i)
            p.tasks.append(Task(f["op"], f["ins"], f["outs"], tuple(Wait(*w) for w in f["waits"]), f["signal"],
                                f["params"], f["label"], f["bytes"], f["flops"], f["inline"]))
        return p

    def save(self, path) -> None:
        with open(path, "w") as f:
            f.write(self.to_json())

    @classmethod
    def load(cls, path) -> "Program":
        path = Path(path)
        try:
            size = path.stat().st_size
            if size > MAX_FILE_BYTES:
                raise ir_json.Malformed(f"{path}: {size} bytes, more than a program file holds ({MAX_FILE_BYTES})")
            return cls.from_json(path.read_bytes())
        except OSError as e:
            raise UserError(f"{path}: cannot read it: {e.strerror}") from None
        except ir_json.Malformed as e:
            raise ir_json.Malformed(f"{path}: {e}") from None
