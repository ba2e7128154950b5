"""Tagged hand-offs (docs/ir.md): which activations travel as (value, tag) words, and which waits the
GPU meets by polling those tags instead of its producers' counter.

A tagged buffer's words each carry the step that wrote them. A reader that needs a word polls it
until its tag is the step's own: one L2 round trip, where a counter hand-off costs a release, a polled
acquire and then the load (bench/results/probe/2026-11-26-fee0ff4-handoff-latency.json: 1.93 us
under load against 0.52-0.61). A wait is polled when every producer of its counter writes words the
task reads: seeing them orders the task after those producers' words, and, since a store issues
only after the loads that feed it returned, after everything they read. What a polled edge does
not carry is other buffers' rows: the validator wants every read of an untagged buffer ordered by
counter waits alone (counter_ordered_reads), so the other rules reason about the program unchanged.
"""
from __future__ import annotations

import dataclasses
from typing import Iterator

import numpy as np

from megavm.core.abi import MAX_WAITS
from megavm.core.types import BufferKind, DType
from megavm.instructions import SPECS
from megavm.schedule.happens import Ancestry, overlap_pairs
from megavm.schedule.ir import Program, Wait
from megavm.schedule.rules import Facts


def _bindings(p: Program) -> tuple[dict[int, list], dict[int, list]]:
    """Per buffer: (task, slot) of each task reading it, and of each writing it."""
    readers: dict[int, list] = {}
    writers: dict[int, list] = {}
    for i, t in enumerate(p.tasks):
        s = SPECS.get(t.opcode)
        if s is None:
            continue
        for ids, slots, out in ((t.inputs, s.inputs, readers), (t.outputs, s.outputs, writers)):
            for k, b in enumerate(ids):
                if 0 <= b < len(p.buffers) and k < len(slots):
                    out.setdefault(b, []).append((i, slots[k]))
    return readers, writers


def _taggable(p: Program, b: int, readers, writers) -> bool:
    buf = p.buffers[b]
    if buf.kind != BufferKind.ACTIVATION or buf.dtype != DType.F32:
        return False
    rs, ws = readers.get(b, []), writers.get(b, [])
    return bool(rs and ws) and all(slot.tagged for _, slot in rs + ws)


class _Cover:
    """Which tasks write tagged words a task reads: per (buffer, box) read, the tasks whose writes of
    that buffer meet the box, found once with numpy and kept (a layer's readers mostly read one box)."""

    def __init__(self, f):
        self.f, self.cache = f, {}

    def writers(self, x: int, box) -> frozenset:
        if (x, box) not in self.cache:
            a = self.f.accesses.get(x)
            if a is None:
                self.cache[x, box] = frozenset()
            else:
                meet, _ = overlap_pairs(a.lo, a.hi, np.array([[b[0] for b in box]]), np.array([[b[1] for b in box]]))
                self.cache[x, box] = frozenset(a.task[meet[a.write[meet]]].tolist())
        return self.cache[x, box]

    def uncovered(self, i: int, producers) -> int | None:
        """The first of the producers that writes no tagged word task i reads (None: each writes one)."""
        p = self.f.p
        w: set[int] = set()
        for x, wr, box in self.f.task_accesses(i):
            if not wr and p.buffers[x].tagged:
                w |= self.writers(x, box)
        return next((j for j in producers if j not in w), None)


def tag_handoffs(p: Program, plain: tuple[str, ...] = ()) -> Program:
    """Tag every f32 activation whose every reader and writer takes it tagged (but those whose names
    start with one of `plain`), then poll each wait whose counter's producers all write tagged words
    the waiting task reads. In place; returns p."""
    readers, writers = _bindings(p)
    for b in range(len(p.buffers)):
        if _taggable(p, b, readers, writers) and not p.buffers[b].name.startswith(plain):
            p.buffers[b] = dataclasses.replace(p.buffers[b], tagged=True)
    f = Facts(p, None)
    cover = _Cover(f)
    producers = p.producers()
    for i, t in enumerate(p.tasks):
        if t.inline or not any(p.buffers[b].tagged for b in t.inputs if 0 <= b < len(p.buffers)):
            continue
        t.waits = tuple(dataclasses.replace(w, polled=bool(producers[w.counter]) and cover.uncovered(
            i, producers[w.counter]) is None) for w in t.waits)
    # an untagged read that only polled waits order after its writer (the residual an unfused ADD
    # reads) gets a counter wait of its own on the writer's counter, met long before; where the ABI has
    # no room, or that is not enough, the program keeps counter waits everywhere. (The accesses f holds
    # do not depend on the waits, and _unordered_reads takes the waits from the program itself.)
    bad = _unordered_reads(f)
    if not bad:
        return p
    for b, x, y in bad:
        writer, reader = p.tasks[int(f.accesses[b].task[x])], p.tasks[int(f.accesses[b].task[y])]
        c = writer.signal
        if c < 0 or not producers[c] or any(w.counter == c and not w.polled for w in reader.waits):
            continue
        if len(reader.waits) >= MAX_WAITS:
            return _untag(p)
        reader.waits = tuple(w for w in reader.waits if w.counter != c) + (Wait(c, len(producers[c])),)
    return p if not _unordered_reads(f) else _untag(p)


def _untag(p: Program) -> Program:
    """No tagged buffers and no polled waits (the waits tag_handoffs added stay: they only order more)."""
    p.buffers = [dataclasses.replace(b, tagged=False) for b in p.buffers]
    for t in p.tasks:
        t.waits = tuple(dataclasses.replace(w, polled=False) for w in t.waits)
    return p


# -- the validator's rule (schedule/validate.py: "tagged") ----------------------------------------

def tagged(f) -> Iterator[str]:
    """Tagged buffers are f32 activations bound only at slots that take them tagged, written once a
    step (no two writers' boxes meet); a polled wait's counter has producers that all write tagged
    words the task reads, and an inline task polls nothing."""
    p = f.p
    plain = set()                        # tagged buffers that are not F32 activations: named once, below
    for b, buf in enumerate(p.buffers):
        if buf.tagged and (buf.kind != BufferKind.ACTIVATION or buf.dtype != DType.F32):
            plain.add(b)
            yield (f"{f.buf(b)} is tagged but is a {buf.dtype.name} {buf.kind.name}; tagged buffers are F32 "
                   "activations")
    tagged_ids = {b for b, buf in enumerate(p.buffers) if buf.tagged} - plain
    for i, t in enumerate(p.tasks):      # one pass over the bindings
        s = SPECS[t.opcode]
        for ids, slots, verb in ((t.inputs, s.inputs, "reads"), (t.outputs, s.outputs, "writes")):
            for k, x in enumerate(ids):
                if x in tagged_ids and k < len(slots) and not slots[k].tagged:
                    yield (f"{f.who(i)} {verb} tagged {f.buf(x)} at slot {slots[k].name!r}, which takes "
                           "plain f32 only")
    for b in sorted(tagged_ids):
        a = f.accesses.get(b)
        if a is None:
            continue
        w = np.flatnonzero(a.write)
        x, y = overlap_pairs(a.lo[w], a.hi[w], a.lo[w], a.hi[w])
        keep = a.task[w[x]] < a.task[w[y]]
        for x, y in list(zip(w[x][keep], w[y][keep]))[:5]:
            yield (f"tagged {f.buf(b)}: {f.who(int(a.task[x]))} writes {a.box(x)} and {f.who(int(a.task[y]))} "
                   f"writes {a.box(y)}; a tagged word is written once a step")
    prod = f.producers
    cover = _Cover(f)
    for i, t in enumerate(p.tasks):
        for k, wt in enumerate(t.waits):
            if not wt.polled:
                continue
            if t.inline:
                yield f"{f.who(i)} is inline and polls its wait {k}; an inline task's one wait is its signaller's"
                continue
            if not 0 <= wt.counter < len(prod) or not prod[wt.counter]:
                continue        # ids_in_range and wait_satisfiable name these
            j = cover.uncovered(i, prod[wt.counter])
            if j is not None:
                yield (f"{f.who(i)} polls its wait {k} on {f.ctr(wt.counter)}, but producer {f.who(j)} "
                       "writes no tagged word it reads: only a counter wait orders it after that producer")
    yield from counter_ordered_reads(f)


def counter_ordered_reads(f) -> Iterator[str]:
    """Every read of an untagged buffer is ordered after its writers by counter waits alone. A polled
    edge orders the reader after the writer's own words: another buffer's rows reach the reader in
    order only through a counter (its acquire), so a read that only a polled edge orders could meet a
    stale line."""
    for b, x, y in _unordered_reads(f)[:5]:
        a = f.accesses[b]
        yield (f"{f.buf(b)}: {f.who(int(a.task[y]))} reads {a.box(y)}, written by {f.who(int(a.task[x]))}, "
               "after it only through a polled wait; untagged data needs a counter path")


def _unordered_reads(f) -> list[tuple[int, int, int]]:
    """(buffer, write access, read access) for each read of an untagged buffer that no chain of counter
    waits orders after its writer."""
    p = f.p
    out: list[tuple[int, int, int]] = []
    if not any(w.polled for t in p.tasks for w in t.waits):
        return out
    prod = f.producers
    joins = [tuple(w.counter for w in t.waits if not w.polled and 0 <= w.counter < len(prod) and prod[w.counter]
                   and w.threshold >= len(prod[w.counter])) for t in p.tasks]
    for b in sorted(f.accesses):
        if p.buffers[b].tagged or p.buffers[b].kind not in (BufferKind.ACTIVATION, BufferKind.OUTPUT,
                                                             BufferKind.KV_CACHE):
            continue
        a = f.accesses[b]
        i, j = f.write_pairs(b)
        i, j = i[~a.write[j]], j[~a.write[j]]
        fwd = a.task[i] < a.task[j]
        i, j = i[fwd], j[fwd]
        if p.buffers[b].kind == BufferKind.KV_CACHE and len(i):       # reads of earlier steps' rows only
            keep = np.array([b not in f.history_reads(int(t)) for t in a.task[j]], bool)
            i, j = i[keep], j[keep]
        if not len(i):
            continue
        ok = Ancestry(np.unique(a.task), joins, prod).before(a.task[i], a.task[j])
        out += [(b, x, y) for x, y in zip(i[~ok].tolist(), j[~ok].tolist())]
    return out
