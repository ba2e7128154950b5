"""The validator's rules: small named functions, each yielding one message per problem.

Every message names the task (index, label, opcode) and the buffer or counter involved. Facts that
several rules share (producers, accesses, happens-before windows) are computed once, in `Facts`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property
from typing import Iterator

import numpy as np

from megavm.core.abi import MAX_DIMS, MAX_WAITS
from megavm.core.types import BufferKind
from megavm.instructions import Op, spec
from megavm.instructions.spec import ABSENT, Stream
from megavm.schedule.happens import Ancestry, find_cycles, fmt_box, overlap_pairs, uncovered
from megavm.schedule.ir import Program, Task

SHARED = (BufferKind.ACTIVATION, BufferKind.OUTPUT, BufferKind.KV_CACHE)
WRITTEN_BEFORE_READ = (BufferKind.ACTIVATION, BufferKind.OUTPUT)
READ_ONLY = (BufferKind.WEIGHT, BufferKind.INPUT)
PAIRS_SHOWN = 5                 # problem pairs spelled out per buffer and rule; the rest are counted
OPCODES = set(int(o) for o in Op)


@dataclass
class Accesses:
    """Every access to one buffer: task [n], write [n], lo/hi [n, ndim]."""
    task: np.ndarray
    write: np.ndarray
    lo: np.ndarray
    hi: np.ndarray

    def box(self, k: int) -> str:
        return fmt_box(tuple(zip(self.lo[k].tolist(), self.hi[k].tolist())))


class Facts:
    """What several rules need, computed at most once per validation."""

    def __init__(self, program: Program, queues: list[list[int]] | None):
        self.p, self.queues = program, queues
        self._ancestry: dict[int, Ancestry] = {}
        self._task_accesses: dict[int, list] = {}
        self._history: dict[int, set[int]] = {}
        self._pairs: dict[int, tuple[np.ndarray, np.ndarray]] = {}

    def who(self, i: int) -> str:
        return self.p.describe_task(i)

    def buf(self, b: int) -> str:
        return f"buffer {self.p.buffers[b].name!r}"

    def ctr(self, c: int) -> str:
        return f"counter {self.p.counters[c].name!r} (#{c})"

    def node(self, v: int) -> str:
        n = len(self.p.tasks)
        return self.who(v) if v < n else self.ctr(v - n)

    @cached_property
    def producers(self) -> list[list[int]]:
        return self.p.producers()

    @cached_property
    def joins(self) -> list[tuple[int, ...]]:
        """Per task: the counters it waits for with a full join (all producers finished)."""
        prod = self.producers
        return [tuple(w.counter for w in t.waits if prod[w.counter] and w.threshold >= len(prod[w.counter]))
                for t in self.p.tasks]

    @cached_property
    def counter_edges(self) -> list[tuple[int, int]]:
        """Task -> counter node (n + c) for each signal, counter node -> task for each wait."""
        n = len(self.p.tasks)
        edges = []
        for i, t in enumerate(self.p.tasks):
            if t.signal >= 0:
                edges.append((i, n + t.signal))
            edges += [(n + w.counter, i) for w in t.waits]
        return edges

    def task_accesses(self, i: int) -> list[tuple[int, bool, tuple]]:
        """(buffer, is write, box) for each region task i declares."""
        if i not in self._task_accesses:
            t = self.p.tasks[i]
            declared = spec(t.opcode).accesses(t.params, *self.p.operands(i))
            self._task_accesses[i] = [((t.inputs if a.io == "in" else t.outputs)[a.slot], a.io == "out", tuple(a.box))
                                      for a in declared]
            self._history[i] = {t.inputs[a.slot] for a in declared if a.io == "in" and a.history}
        return self._task_accesses[i]

    def history_reads(self, i: int) -> set[int]:
        """The KV caches task i reads history only: rows earlier steps wrote (spec.Access.history)."""
        self.task_accesses(i)
        return self._history[i]

    @cached_property
    def accesses(self) -> dict[int, Accesses]:
        """Accesses to every ACTIVATION, OUTPUT and KV_CACHE buffer, grouped by buffer."""
        rows: dict[int, list] = {}
        for i in range(len(self.p.tasks)):
            for b, w, box in self.task_accesses(i):
                if self.p.buffers[b].kind in SHARED:
                    rows.setdefault(b, []).append((i, w, [lo for lo, _ in box], [hi for _, hi in box]))
        return {b: Accesses(np.array([r[0] for r in rs], np.int64), np.array([r[1] for r in rs], bool),
                            np.array([r[2] for r in rs], np.int64), np.array([r[3] for r in rs], np.int64))
                for b, rs in rows.items()}

    def ancestry(self, b: int) -> Ancestry:
        if b not in self._ancestry:
            self._ancestry[b] = Ancestry(np.unique(self.accesses[b].task), self.joins, self.producers)
        return self._ancestry[b]

    def write_pairs(self, b: int) -> tuple[np.ndarray, np.ndarray]:
        """Access index pairs (i, j): i a write, j any access of another task, boxes overlapping;
        one pair per pair of tasks (and each write-write pair once)."""
        if b in self._pairs:
            return self._pairs[b]
        a = self.accesses[b]
        w = np.flatnonzero(a.write)
        i, j = overlap_pairs(a.lo[w], a.hi[w], a.lo, a.hi)
        i = w[i]
        keep = (a.task[i] != a.task[j]) & ~(a.write[j] & (j < i))
        i, j = i[keep], j[keep]
        _, first = np.unique(a.task[i] * (len(self.p.tasks) + 1) + a.task[j], return_index=True)
        self._pairs[b] = i[first], j[first]
        return self._pairs[b]


# -- structure ----------------------------------------------------------------------------------
def ids_in_range(f: Facts) -> Iterator[str]:
    nb, nc = len(f.p.buffers), len(f.p.counters)
    for i, t in enumerate(f.p.tasks):
        known = t.opcode in OPCODES
        if not known:
            yield f"{f.who(i)}: unknown opcode {t.opcode}"
        for io, ids, slots in (("input", t.inputs, spec(t.opcode).inputs if known else ()),
                               ("output", t.outputs, spec(t.opcode).outputs if known else ())):
            for k, b in enumerate(ids):
                empty_ok = b == ABSENT and k < len(slots) and slots[k].optional
                if not 0 <= b < nb and not empty_ok:
                    yield f"{f.who(i)}: {io} {k} is buffer id {b}, outside the {nb} buffers"
        for w in t.waits:
            if not 0 <= w.counter < nc:
                yield f"{f.who(i)}: waits on counter id {w.counter}, outside the {nc} counters"
        if not -1 <= t.signal < nc:
            yield f"{f.who(i)}: signals counter id {t.signal}, outside the {nc} counters (-1: none)"


def abi_limits(f: Facts) -> Iterator[str]:
    for b, buf in enumerate(f.p.buffers):
        if not 1 <= len(buf.shape) <= MAX_DIMS or min(buf.shape) < 1:
            yield f"{f.buf(b)} has shape {buf.shape}; the ABI takes 1 to {MAX_DIMS} axes, each >= 1"
    for i, t in enumerate(f.p.tasks):
        if len(t.waits) > MAX_WAITS:
            yield f"{f.who(i)}: {len(t.waits)} waits; the ABI holds {MAX_WAITS}"


def arity(f: Facts) -> Iterator[str]:
    for i, t in enumerate(f.p.tasks):
        s = spec(t.opcode)
        for io, slots, ids in (("input", s.inputs, t.inputs), ("output", s.outputs, t.outputs)):
            if len(ids) != len(slots):
                yield f"{f.who(i)}: {len(ids)} {io}s, the opcode takes {len(slots)} ({[x.name for x in slots]})"
                continue
            for slot, b in zip(slots, ids):
                if b == ABSENT:
                    continue
                buf = f.p.buffers[b]
                if buf.kind not in slot.kinds:
                    yield (f"{f.who(i)}: {io} {slot.name!r} is {f.buf(b)} of kind {buf.kind.name}; "
                           f"the slot takes {[k.name for k in slot.kinds]}")
                if buf.dtype not in slot.dtypes:
                    yield (f"{f.who(i)}: {io} {slot.name!r} is {f.buf(b)} of dtype {buf.dtype.name}; "
                           f"the slot takes {[d.name for d in slot.dtypes]}")


F32_MAX = 3.4028234663852886e38           # the largest finite f32: a param word holds an f32


def _param_problems(s, params: dict) -> list[str]:
    out = [f"missing param {p!r}" for p in s.param_names if p not in params]
    out += [f"unknown param {p!r}" for p in sorted(set(params) - set(s.param_names))]
    for p in s.param_names:
        v = params.get(p)
        if v is None or isinstance(v, bool):
            continue
        if p in s.float_params:
            if not isinstance(v, (int, float)) or not math.isfinite(v) or abs(v) > F32_MAX:
                out.append(f"param {p}={v!r} must be a finite number an f32 holds (|v| <= {F32_MAX:.7g})")
        elif not isinstance(v, int) or not -(1 << 31) <= v < 1 << 31:
            out.append(f"param {p}={v!r} must be an integer that fits in 32 bits")
    return out


def params(f: Facts) -> Iterator[str]:
    for i, t in enumerate(f.p.tasks):
        s = spec(t.opcode)
        bad = _param_problems(s, t.params)
        if not bad:
            ins, outs = f.p.operands(i)
            try:
                bad = s.check(t.params, ins, outs)
            except Exception as e:
                bad = [f"shape check raised {type(e).__name__}: {e}"]
            if bad:
                names = ", ".join(f"{x.name}={b.name if b else None!r}" for x, b in zip(s.inputs + s.outputs, ins + outs))
                bad = [f"{m} (operands {names})" for m in bad]
        if not bad:
            try:
                for b, w, box in f.task_accesses(i):
                    shape = f.p.buffers[b].shape
                    if len(box) != len(shape) or any(not 0 <= lo <= hi <= n for (lo, hi), n in zip(box, shape)):
                        bad.append(f"declares {'write' if w else 'read'} box {fmt_box(box)} outside "
                                   f"{f.buf(b)} of shape {shape}")
            except Exception as e:
                bad = [f"accesses raised {type(e).__name__}: {e}"]
        yield from (f"{f.who(i)}: {m}" for m in bad)


# -- counters and the task graph ----------------------------------------------------------------
def _producers(n: int) -> str:
    return f"{n} producer" + "s" * (n != 1)


def wait_satisfiable(f: Facts) -> Iterator[str]:
    for i, t in enumerate(f.p.tasks):
        for w in t.waits:
            n = len(f.producers[w.counter])
            if w.counter == t.signal:
                yield f"{f.who(i)}: waits on {f.ctr(w.counter)}, which it signals itself"
            if n == 0:
                yield f"{f.who(i)}: waits on {f.ctr(w.counter)}, which no task signals"
            elif not 1 <= w.threshold <= n:
                yield f"{f.who(i)}: waits for {f.ctr(w.counter)} >= {w.threshold}, but it has {_producers(n)}"


def all_join(f: Facts) -> Iterator[str]:
    for i, t in enumerate(f.p.tasks):
        for w in t.waits:
            n = len(f.producers[w.counter])
            if 1 <= w.threshold < n:
                yield (f"{f.who(i)}: waits for {f.ctr(w.counter)} >= {w.threshold}, but it has {_producers(n)}; "
                       f"a shared counter is an all-join (threshold {n})")


def describe_cycle(f: Facts, cyc: list[int]) -> str:
    return " -> ".join(f.node(v) for v in cyc)


def acyclic(f: Facts) -> Iterator[str]:
    for cyc in find_cycles(len(f.p.tasks) + len(f.p.counters), f.counter_edges):
        yield f"cycle: {describe_cycle(f, cyc)}"


def program_order(f: Facts) -> Iterator[str]:
    for i, t in enumerate(f.p.tasks):
        for w in t.waits:
            later = [p for p in f.producers[w.counter] if p >= i]
            if later:
                more = f" (and {len(later) - 1} more)" if len(later) > 1 else ""
                yield (f"{f.who(i)}: waits on {f.ctr(w.counter)}, which {f.who(later[0])}{more} signals "
                       f"at or after it in program order")


def _streams_of(f: Facts, kind: str) -> Iterator[tuple[int, Task, Stream, dict[int, set[int]]]]:
    """(task, its stream, the program's writers) for each late-bound ("index") or history ("window")
    stream, the writers computed at the first one."""
    writers = None
    for i, t in enumerate(f.p.tasks):
        for st in spec(t.opcode).streams(t.params, *f.p.operands(i)):
            if getattr(st, kind) is not None:
                writers = writers if writers is not None else f.p.writers()
                yield i, t, st, writers


def late_bound(f: Facts) -> Iterator[str]:
    """The loader reads a late-bound stream's expert ids after ONE wait of its task, ahead of the
    others: that wait must be a full join on a counter every writer of the ids signals."""
    told = set()
    for i, t, st, writers in _streams_of(f, "index"):
        b = t.inputs[st.index[0]]
        if i not in told and f.p.index_wait(i, b, writers, f.producers) is None:
            told.add(i)
            who = sorted(writers.get(b, ()))
            by = ", ".join(f.who(w) for w in who[:3]) + (f" and {len(who) - 3} more" if len(who) > 3 else "")
            yield (f"{f.who(i)}: streams the experts {f.buf(b)} names, but none of its waits is a full join on a "
                   f"counter that every writer of the ids signals ({by or 'no task writes them'}); its loader "
                   f"would read the ids before they are written")


def history(f: Facts) -> Iterator[str]:
    """The loader copies a history stream's KV rows once one wait of its task was met a step before:
    that wait must be a full join on a counter every writer of those rows signals."""
    told, outs = set(), {}
    for i, t, st, writers in _streams_of(f, "window"):
        if i not in told and f.p.history_wait(i, st, writers, f.producers, outs) is None:
            told.add(i)
            yield (f"{f.who(i)}: streams KV rows of {f.buf(t.inputs[st.slot])} that earlier steps wrote, but "
                   f"none of its waits is a full join on a counter that every writer of those rows signals; "
                   f"its loader would copy them before they are written")


# -- memory -------------------------------------------------------------------------------------
def read_only(f: Facts) -> Iterator[str]:
    for i, t in enumerate(f.p.tasks):
        for slot, b in enumerate(t.outputs):
            if b != ABSENT and f.p.buffers[b].kind in READ_ONLY:
                yield f"{f.who(i)}: output {slot} writes {f.buf(b)} of kind {f.p.buffers[b].kind.name}"


def _shown(f: Facts, b: int, bad: tuple[np.ndarray, np.ndarray], say, what: str) -> Iterator[str]:
    """Messages for the first PAIRS_SHOWN bad access pairs of buffer b, then a count of the rest."""
    i, j = bad
    for x, y in zip(i[:PAIRS_SHOWN].tolist(), j[:PAIRS_SHOWN].tolist()):
        yield say(x, y)
    if len(i) > PAIRS_SHOWN:
        yield f"{f.buf(b)}: {len(i) - PAIRS_SHOWN} more {what} like the above"


def read_after_write(f: Facts) -> Iterator[str]:
    for b in sorted(f.accesses):
        if f.p.buffers[b].kind not in WRITTEN_BEFORE_READ:
            continue
        a = f.accesses[b]
        i, j = f.write_pairs(b)
        i, j = i[~a.write[j]], j[~a.write[j]]
        ok = f.ancestry(b).before(a.task[i], a.task[j])

        def say(x, y, a=a, b=b):
            return (f"{f.buf(b)}: {f.who(int(a.task[y]))} reads {a.box(y)}, which {f.who(int(a.task[x]))} "
                    f"writes {a.box(x)}, but no counter path leads from the writer to the reader")
        yield from _shown(f, b, (i[~ok], j[~ok]), say, "reads before writes")
        yield from _unwritten_reads(f, b)


def _unwritten_reads(f: Facts, b: int) -> Iterator[str]:
    a = f.accesses[b]
    reads, writes = np.flatnonzero(~a.write), np.flatnonzero(a.write)
    if not len(reads):
        return
    boxes, first = np.unique(np.concatenate([a.lo[reads], a.hi[reads]], axis=1), axis=0, return_index=True)
    nd = a.lo.shape[1]
    r, w = overlap_pairs(boxes[:, :nd], boxes[:, nd:], a.lo[writes], a.hi[writes])
    # one writer holding the whole read box settles it; only the rest need the union
    holds = (a.lo[writes[w]] <= boxes[r, :nd]).all(axis=1) & (a.hi[writes[w]] >= boxes[r, nd:]).all(axis=1)
    settled = set(r[holds].tolist())
    order = np.argsort(r, kind="stable")
    cuts = np.searchsorted(r[order], np.arange(len(boxes) + 1))
    for k in np.argsort(first, kind="stable").tolist():
        if k in settled:
            continue
        box = tuple(zip(boxes[k, :nd].tolist(), boxes[k, nd:].tolist()))
        ws = writes[w[order[cuts[k]:cuts[k + 1]]]]
        hole = uncovered(box, [tuple(zip(a.lo[x].tolist(), a.hi[x].tolist())) for x in ws])
        if hole is not None:
            reader = int(a.task[reads[first[k]]])
            yield f"{f.buf(b)}: {f.who(reader)} reads {fmt_box(box)}, but no task writes {fmt_box(hole)} of it"


def no_race(f: Facts) -> Iterator[str]:
    for b in sorted(f.accesses):
        a = f.accesses[b]
        i, j = f.write_pairs(b)
        ti, tj = a.task[i], a.task[j]
        ok = f.ancestry(b).before(np.minimum(ti, tj), np.maximum(ti, tj))

        def say(x, y, a=a, b=b):
            verb = "writes" if a.write[y] else "reads"
            return (f"{f.buf(b)}: {f.who(int(a.task[x]))} writes {a.box(x)} and {f.who(int(a.task[y]))} "
                    f"{verb} {a.box(y)}, with no counter path between them")
        yield from _shown(f, b, (i[~ok], j[~ok]), say, "unordered conflicting pairs")


def outputs_written(f: Facts) -> Iterator[str]:
    for b in f.p.buffers_of_kind(BufferKind.OUTPUT):
        a = f.accesses.get(b)
        boxes = [] if a is None else [tuple(zip(a.lo[k].tolist(), a.hi[k].tolist()))
                                      for k in np.flatnonzero(a.write)]
        shape = f.p.buffers[b].shape
        hole = uncovered(tuple((0, n) for n in shape), boxes)
        if not boxes:
            yield f"{f.buf(b)} (OUTPUT) is written by no task"
        elif hole is not None:
            yield f"{f.buf(b)} (OUTPUT): no task writes {fmt_box(hole)} of it"
