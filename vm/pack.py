"""Packing: a program and its per-SM queues -> the abi.h tables (numpy structured arrays), and back
from bytes. The ReferenceVM and the megakernel both run these tables, never the Python objects."""
from __future__ import annotations

from dataclasses import dataclass, field

import networkx as nx
import numpy as np

from megavm.core import abi
from megavm.core.types import Buffer, BufferKind, DType, block_scale_name, scale_name
from megavm.instructions import feeds_next_token, spec
from megavm.schedule.ir import Counter, Program, Task, Wait
from megavm.vm.sizing import xs_need

ARENA_ALIGN = 256
ARENA_KINDS = (BufferKind.ACTIVATION, BufferKind.OUTPUT, BufferKind.INPUT)   # in the arena, at arena_offset


@dataclass
class PackedProgram:
    header: np.ndarray           # abi.HEADER, shape ()
    buffers: np.ndarray          # abi.BUFFER [n_buffers]
    instrs: np.ndarray           # abi.INSTR [n_instrs]
    counter_producers: np.ndarray  # u32 [n_counters]: signals per step
    queue_offsets: np.ndarray    # u32 [n_queues + 1]
    queue_entries: np.ndarray    # u32 [n_entries]: instruction indices
    names: list[str]
    meta: dict = field(default_factory=dict)

    @property
    def n_queues(self) -> int:
        return len(self.queue_offsets) - 1

    def queue(self, q: int) -> np.ndarray:
        return self.queue_entries[self.queue_offsets[q]:self.queue_offsets[q + 1]]

    def inline_of(self) -> np.ndarray:
        """i32 [n_counters]: the inline instruction waiting on each counter, or -1 (abi.h: args.inline_of)."""
        out = np.full(len(self.counter_producers), -1, np.int32)
        for i in np.flatnonzero(self.instrs["flags"] & abi.INSTR_INLINE).tolist():
            out[int(self.instrs[i]["waits"][0]["counter"])] = i
        return out

    def buffer_id(self, name: str) -> int:
        try:
            return self.names.index(name)
        except ValueError:
            raise KeyError(f"no buffer named {name!r} in the packed program") from None

    def shape(self, b: int) -> tuple[int, ...]:
        r = self.buffers[b]
        return tuple(int(s) for s in r["shape"][:r["ndim"]])

    def buffer(self, b: int) -> Buffer:
        r = self.buffers[b]
        return Buffer(self.names[b], BufferKind(int(r["kind"])), DType(int(r["dtype"])), self.shape(b),
                      bool(r["flags"] & abi.BUFFER_TAGGED))

    def operands(self, i: int) -> tuple[list[Buffer | None], list[Buffer | None]]:
        """The input and output buffers of instruction i, None where an optional slot is empty."""
        r = self.instrs[i]
        return ([self.buffer(int(b)) if b >= 0 else None for b in r["inputs"][:r["n_inputs"]]],
                [self.buffer(int(b)) if b >= 0 else None for b in r["outputs"][:r["n_outputs"]]])

    def to_bytes(self) -> bytes:
        names_blob = b"".join(n.encode() + b"\0" for n in self.names)
        parts = [self.buffers.tobytes(), self.instrs.tobytes(), self.counter_producers.tobytes(),
                 self.queue_offsets.tobytes(), self.queue_entries.tobytes(), names_blob]
        hdr = self.header.copy()
        off = abi.HEADER.itemsize
        offsets = []
        for p in parts:
            off = _align(off, 16)
            offsets.append(off)
            off += len(p)
        for key, o in zip(("buffers_offset", "instrs_offset", "counters_offset", "queue_offsets_offset",
                           "queue_entries_offset", "names_offset"), offsets):
            hdr[key] = o
        hdr["total_bytes"] = off
        blob = bytearray(off)
        blob[:abi.HEADER.itemsize] = hdr.tobytes()
        for o, p in zip(offsets, parts):
            blob[o:o + len(p)] = p
        return bytes(blob)

    @classmethod
    def from_bytes(cls, blob: bytes) -> "PackedProgram":
        if len(blob) < abi.HEADER.itemsize:
            raise ValueError("packed program too short for a header")
        hdr = np.frombuffer(blob, abi.HEADER, count=1)[0].copy()
        if int(hdr["magic"]) != abi.MAGIC:
            raise ValueError(f"bad magic 0x{int(hdr['magic']):08x}; not a megavm packed program")
        if int(hdr["abi_version"]) != abi.ABI_VERSION:
            raise ValueError(f"packed program has ABI version {int(hdr['abi_version'])}, this megavm reads {abi.ABI_VERSION}")
        if int(hdr["total_bytes"]) != len(blob):
            raise ValueError(f"packed program is {len(blob)} bytes, header says {int(hdr['total_bytes'])}")

        def table(key, dt, n):
            return np.frombuffer(blob, dt, count=n, offset=int(hdr[key])).copy()
        nq = int(hdr["n_queues"])
        names_raw = blob[int(hdr["names_offset"]):].split(b"\0")[:int(hdr["n_buffers"])]
        return cls(hdr, table("buffers_offset", abi.BUFFER, int(hdr["n_buffers"])),
                   table("instrs_offset", abi.INSTR, int(hdr["n_instrs"])),
                   table("counters_offset", np.uint32, int(hdr["n_counters"])),
                   table("queue_offsets_offset", np.uint32, nq + 1),
                   table("queue_entries_offset", np.uint32, int(hdr["n_entries"])),
                   [n.decode() for n in names_raw])


def _align(x: int, a: int) -> int:
    return (x + a - 1) // a * a


def pack(program: Program, queues: list[list[int]]) -> PackedProgram:
    nb, nt, nc = len(program.buffers), len(program.tasks), len(program.counters)
    buffers = np.zeros(nb, abi.BUFFER)
    names, name_off, arena = [], 0, 0
    for i, b in enumerate(program.buffers):
        if len(b.shape) > abi.MAX_DIMS:
            raise ValueError(f"buffer {b.name!r} has {len(b.shape)} dims; the ABI holds {abi.MAX_DIMS}")
        r = buffers[i]
        r["kind"], r["dtype"], r["ndim"] = int(b.kind), int(b.dtype), len(b.shape)
        r["flags"] = abi.BUFFER_TAGGED if b.tagged else 0
        r["name_offset"] = name_off
        r["shape"][:len(b.shape)] = b.shape
        r["nbytes"] = b.nbytes
        scaled = b.dtype in (DType.F8E4M3, DType.E2M1)
        r["scale"] = program._names().get(scale_name(b.name), -1) if scaled else -1
        r["block_scale"] = (program._names().get(block_scale_name(b.name), -1)
                            if b.dtype in (DType.E2M1, DType.U4, DType.F8E4M3) else -1)
        if b.kind in ARENA_KINDS:
            r["arena_offset"] = arena
            arena = _align(arena + b.nbytes, ARENA_ALIGN)
        names.append(b.name)
        name_off += len(b.name.encode()) + 1

    instrs = np.zeros(nt, abi.INSTR)
    inline_of = program.inline_of()
    late_facts = None                    # (writers, producers), computed at the first late-bound or history stream
    outs: dict[int, list] = {}           # each KV writer's writes, kept across history streams
    for i, t in enumerate(program.tasks):
        s = spec(t.opcode)
        r = instrs[i]
        if len(t.waits) > abi.MAX_WAITS:
            raise ValueError(f"{program.describe_task(i)} has {len(t.waits)} waits; the ABI holds {abi.MAX_WAITS}")
        r["opcode"], r["n_inputs"], r["n_outputs"], r["n_waits"] = t.opcode, len(t.inputs), len(t.outputs), len(t.waits)
        r["signal"], r["task"] = t.signal, i
        r["flags"] = ((abi.INSTR_INLINE if t.inline else 0) | (abi.INSTR_SIGNALS_INLINE if t.signal in inline_of else 0)
                      | sum(abi.INSTR_POLLED_WAIT0 << j for j, w in enumerate(t.waits) if w.polled))
        r["inputs"] = list(t.inputs) + [-1] * (len(r["inputs"]) - len(t.inputs))
        r["outputs"] = list(t.outputs) + [-1] * (len(r["outputs"]) - len(t.outputs))
        r["waits"]["counter"] = -1
        for j, w in enumerate(t.waits):
            r["waits"][j] = (w.counter, w.threshold)
        r["params"] = s.encode_params(t.params)
        streams = s.streams(t.params, *program.operands(i))
        assert len(streams) <= abi.MAX_STREAMS, f"{s.name} declares {len(streams)} streams"
        r["n_streams"] = len(streams)
        r["streams"]["buffer"] = -1
        for j, st in enumerate(streams):
            b = t.inputs[st.slot]
            isz = program.buffers[b].dtype.itemsize
            late = (abi.NO_INDEX, 0, 0, 0)
            if st.window is not None:
                if late_facts is None:
                    late_facts = program.writers(), program.producers()
                wait = program.history_wait(i, st, *late_facts, outs)
                if wait is None:     # the validator's history rule refuses such a program first
                    raise ValueError(f"{program.describe_task(i)}: no wait covers the writers of its KV rows")
                late = (abi.STREAM_HISTORY, wait, *abi.stream_window(st.window))
            elif st.index is not None:
                slot, first, count = st.index
                if late_facts is None:
                    late_facts = program.writers(), program.producers()
                wait = program.index_wait(i, t.inputs[slot], *late_facts)
                if wait is None:     # the validator's late_bound rule refuses such a program first
                    raise ValueError(f"{program.describe_task(i)}: no wait covers the writers of its expert ids")
                late = (slot, wait, first, count)
            r["streams"][j] = (b, *late, int(st.elem_offset * isz), int(st.elem_count * isz))

    instrs["flags"] |= np.where(relaxed_signals(instrs), abi.INSTR_SIGNAL_RELAXED, 0).astype(instrs["flags"].dtype)
    instrs["flags"] |= np.where(last_stage(instrs), abi.INSTR_LAST_STAGE, 0).astype(instrs["flags"].dtype)
    producers = np.zeros(nc, np.uint32)
    for t in program.tasks:
        if 0 <= t.signal < nc:
            producers[t.signal] += 1
    offsets = np.zeros(len(queues) + 1, np.uint32)
    offsets[1:] = np.cumsum([len(q) for q in queues])
    entries = np.array([i for q in queues for i in q], dtype=np.uint32)

    hdr = np.zeros((), abi.HEADER)
    hdr["magic"], hdr["abi_version"] = abi.MAGIC, abi.ABI_VERSION
    hdr["n_buffers"], hdr["n_counters"], hdr["n_instrs"] = nb, nc, nt
    hdr["n_queues"], hdr["n_entries"] = len(queues), len(entries)
    hdr["arena_bytes"] = arena
    meta = dict(program.meta, labels=[t.label for t in program.tasks], counters=[c.name for c in program.counters],
                xs_floats=xs_need(program))     # for the build's ring (vm/sizing.py)
    packed = PackedProgram(hdr, buffers, instrs, producers, offsets, entries, names, meta)
    return _with_meta(packed)


def relaxed_signals(instrs: np.ndarray) -> np.ndarray:
    """Which instructions signal a counter that no wait on the GPU acquires: every instruction's wait on it
    is polled (the GPU skips it: docs/ir.md), no stream of the loader waits on it, no inline task does, and it
    is not the step counter (the signal of the task that writes the next token: vm/loop.py).
    The release such a signal would make orders nothing anyone observes, so the kernel increments the
    counter relaxed (INSTR_SIGNAL_RELAXED): thread 0 no longer waits for the block's stores to reach the
    GPU's scope before the block's next instruction. The counter still counts, for dumps."""
    acquired = np.zeros(max(1, int(instrs["signal"].max(initial=-1)) + 1), bool)

    def mark(c: int) -> None:
        if 0 <= c < len(acquired):
            acquired[c] = True
    for r in instrs:
        flags, waits = int(r["flags"]), r["waits"][:int(r["n_waits"])]
        for j, w in enumerate(waits):
            if not flags & (abi.INSTR_POLLED_WAIT0 << j):
                mark(int(w["counter"]))
        for st in r["streams"][:int(r["n_streams"])]:
            if int(st["index_slot"]) != abi.NO_INDEX and int(st["index_wait"]) < len(waits):
                mark(int(waits[int(st["index_wait"])]["counter"]))
        if flags & abi.INSTR_SIGNALS_INLINE or feeds_next_token(int(r["opcode"])):
            mark(int(r["signal"]))
    sig = instrs["signal"].astype(np.int64)
    return (sig >= 0) & ~acquired[np.clip(sig, 0, None)]


def task_graph(instrs: np.ndarray, producers: np.ndarray | None = None) -> nx.DiGraph:
    """The tables' tasks (their indices) and counters (("counter", c)) as a graph: each task -> the counter it
    signals -> each task that waits on that counter. With `producers` (each counter's producer count), only
    the waits for all of a counter's producers give an edge (vm/loop.py: a partial wait proves nothing about
    every producer)."""
    g = nx.DiGraph()
    g.add_nodes_from(range(len(instrs)))
    for t, r in enumerate(instrs):
        if int(r["signal"]) >= 0:
            g.add_edge(t, ("counter", int(r["signal"])))
        for w in r["waits"][:int(r["n_waits"])]:
            c = int(w["counter"])
            if producers is None or int(w["threshold"]) >= int(producers[c]):
                g.add_edge(("counter", c), t)
    return g


def last_stage(instrs: np.ndarray) -> np.ndarray:
    """Which instructions stream weights while no instruction after them does: none that waits on their
    counter, directly or through other counters, has a stream (an LLM's LM head tiles: after them only the
    argmax or the sampler). While they stream, the only loads beside their copies are their own tiles' loads
    of x; no later task of the step's chain waits behind them, so the loader keeps more copies in flight for
    them (INSTR_LAST_STAGE, build knob MVM_LAST_INFLIGHT)."""
    streams = instrs["n_streams"] > 0
    g = task_graph(instrs)
    g.add_edges_from((int(t), "streams") for t in np.flatnonzero(streams))
    before = nx.ancestors(g, "streams") if streams.any() else set()   # every node some streaming task follows
    return np.array([bool(streams[t]) and ("counter", int(r["signal"])) not in before
                     for t, r in enumerate(instrs)], bool)


def _with_meta(p: PackedProgram) -> PackedProgram:
    """Round-trip through bytes so every consumer reads exactly what the GPU will."""
    q = PackedProgram.from_bytes(p.to_bytes())
    q.meta = p.meta
    return q


def unpack(packed: PackedProgram) -> tuple[Program, list[list[int]]]:
    """The program and queues back from the tables, so a packed program can be validated."""
    prog = Program(meta=dict(packed.meta))
    prog.buffers = [packed.buffer(i) for i in range(len(packed.buffers))]
    names = packed.meta.get("counters") or [f"c{i}" for i in range(len(packed.counter_producers))]
    prog.counters = [Counter(n) for n in names]
    labels = packed.meta.get("labels") or []
    order = np.argsort(packed.instrs["task"], kind="stable")
    if not np.array_equal(packed.instrs["task"][order], np.arange(len(order))):
        raise ValueError("packed instructions do not carry task indices 0..n-1")
    for i in order:
        r = packed.instrs[i]
        s = spec(int(r["opcode"]))
        t = int(r["task"])
        prog.tasks.append(Task(int(r["opcode"]), tuple(int(b) for b in r["inputs"][:r["n_inputs"]]),
                               tuple(int(b) for b in r["outputs"][:r["n_outputs"]]),
                               tuple(Wait(int(w["counter"]), int(w["threshold"]),
                                          bool(int(r["flags"]) & (abi.INSTR_POLLED_WAIT0 << j)))
                                     for j, w in enumerate(r["waits"][:r["n_waits"]])),
                               int(r["signal"]), s.decode_params(r["params"]), labels[t] if t < len(labels) else "",
                               inline=bool(int(r["flags"]) & abi.INSTR_INLINE)))
    relaxed = (packed.instrs["flags"] & abi.INSTR_SIGNAL_RELAXED) != 0
    wrong = np.flatnonzero(relaxed & ~relaxed_signals(packed.instrs))
    if len(wrong):
        r = packed.instrs[wrong[0]]
        raise ValueError(f"packed {prog.describe_task(int(r['task']))} signals counter {int(r['signal'])} relaxed "
                         f"(INSTR_SIGNAL_RELAXED), but a wait on the GPU acquires that counter")
    task_of = packed.instrs["task"]
    queues = [[int(task_of[i]) for i in packed.queue(q)] for q in range(packed.n_queues)]
    return prog, queues
