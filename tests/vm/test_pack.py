"""Packing: exact round trip through bytes, refused blobs, the arena and the instruction tables."""
import networkx as nx
import numpy as np
import pytest

from megavm.core import abi
from megavm.core.types import BufferKind, DType
from megavm.instructions import spec
from megavm.schedule.assign import assign
from megavm.schedule.config import ScheduleConfig
from megavm.schedule.ir import Program
from megavm.schedule.lower import lower
from megavm.schedule.models import PRESETS, ModelConfig
from megavm.instructions.spec import NEXT_TOKEN
from megavm.vm.pack import ARENA_ALIGN, ARENA_KINDS, PackedProgram, pack, unpack

ODD = ModelConfig(dim=96, n_layers=3, n_heads=6, n_kv_heads=3, head_dim=16, ffn_dim=200, vocab=1001)


@pytest.fixture(scope="module", params=[("tiny", "f32", 8), ("odd", "bf16", 7)], ids=["tiny-f32-8", "odd-bf16-7"])
def case(request):
    name, dt, n_sms = request.param
    cfg = ODD if name == "odd" else PRESETS[name]
    p = lower(cfg, ScheduleConfig(dtype=dt, capacity=40, n_sms=n_sms))
    q = assign(p, n_sms)
    return p, q, pack(p, q)


def test_round_trip_through_bytes(case):
    _, _, pk = case
    blob = pk.to_bytes()
    back = PackedProgram.from_bytes(blob)
    assert back.header.tobytes() == pk.header.tobytes()
    for name in ("buffers", "instrs", "counter_producers", "queue_offsets", "queue_entries"):
        a, b = getattr(back, name), getattr(pk, name)
        assert a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes(), f"table {name} changed"
    assert back.names == pk.names
    assert back.to_bytes() == blob


def test_header_and_table_offsets(case):
    p, q, pk = case
    blob = pk.to_bytes()
    h = np.frombuffer(blob, abi.HEADER, count=1)[0]
    assert (int(h["magic"]), int(h["abi_version"])) == (abi.MAGIC, abi.ABI_VERSION)
    assert (int(h["n_buffers"]), int(h["n_counters"]), int(h["n_instrs"])) == (len(p.buffers), len(p.counters), len(p.tasks))
    assert int(h["n_queues"]) == len(q) and int(h["n_entries"]) == len(p.tasks)
    assert int(h["total_bytes"]) == len(blob)
    tables = sorted((int(h[k]), n) for k, n in (
        ("buffers_offset", len(p.buffers) * abi.BUFFER.itemsize), ("instrs_offset", len(p.tasks) * abi.INSTR.itemsize),
        ("counters_offset", 4 * len(p.counters)), ("queue_offsets_offset", 4 * (len(q) + 1)),
        ("queue_entries_offset", 4 * len(p.tasks)), ("names_offset", sum(len(b.name) + 1 for b in p.buffers))))
    assert tables[0][0] >= abi.HEADER.itemsize
    for (o, n), (o2, _) in zip(tables, tables[1:] + [(len(blob), 0)]):
        assert o % 16 == 0 and o + n <= o2, f"table at {o} (+{n} bytes) is misaligned or overlaps the next at {o2}"


@pytest.mark.parametrize("field, value, message", [
    ("magic", 0x12345678, "bad magic 0x12345678; not a megavm packed program"),
    ("abi_version", abi.ABI_VERSION + 1, f"ABI version {abi.ABI_VERSION + 1}, this megavm reads {abi.ABI_VERSION}"),
    ("total_bytes", 12, "header says 12"),
])
def test_bad_header_refused(case, field, value, message):
    blob = bytearray(case[2].to_bytes())
    h = np.frombuffer(bytes(blob[:abi.HEADER.itemsize]), abi.HEADER, count=1).copy()
    h[field] = value
    blob[:abi.HEADER.itemsize] = h.tobytes()
    with pytest.raises(ValueError, match=message):
        PackedProgram.from_bytes(bytes(blob))


def test_truncated_refused(case):
    with pytest.raises(ValueError, match="too short for a header"):
        PackedProgram.from_bytes(case[2].to_bytes()[:abi.HEADER.itemsize - 1])
    with pytest.raises(ValueError, match="header says"):
        PackedProgram.from_bytes(case[2].to_bytes()[:-1])


def test_arena_offsets_aligned_and_disjoint(case):
    p, _, pk = case
    spans = []
    for i, b in enumerate(pk.buffers):
        off, n = int(b["arena_offset"]), int(b["nbytes"])
        assert n == p.buffers[i].nbytes, f"{pk.names[i]}: nbytes {n} != {p.buffers[i].nbytes}"
        if BufferKind(int(b["kind"])) in ARENA_KINDS:
            assert off % ARENA_ALIGN == 0, f"{pk.names[i]}: arena offset {off} not {ARENA_ALIGN}-aligned"
            spans.append((off, off + n, pk.names[i]))
        else:
            assert off == 0, f"{pk.names[i]} ({BufferKind(int(b['kind'])).name}) has an arena offset {off}"
    spans.sort()
    for (a0, a1, an), (b0, _, bn) in zip(spans, spans[1:]):
        assert a1 <= b0, f"arena buffers {an} [{a0}, {a1}) and {bn} (from {b0}) overlap"
    assert spans[-1][1] <= int(pk.header["arena_bytes"])


def test_instruction_tables_hold_the_program(case):
    p, q, pk = case
    producers = p.producers()
    assert pk.counter_producers.tolist() == [len(x) for x in producers]
    assert [pk.queue(s).tolist() for s in range(pk.n_queues)] == q
    for i, t in enumerate(p.tasks):
        r, s = pk.instrs[i], spec(t.opcode)
        where = p.describe_task(i)
        assert (int(r["opcode"]), int(r["task"]), int(r["signal"])) == (t.opcode, i, t.signal), where
        assert r["inputs"].tolist() == list(t.inputs) + [-1] * (len(r["inputs"]) - len(t.inputs)), where
        assert r["outputs"].tolist() == list(t.outputs) + [-1] * (len(r["outputs"]) - len(t.outputs)), where
        waits = [(int(w["counter"]), int(w["threshold"])) for w in r["waits"]]
        assert waits == [(w.counter, w.threshold) for w in t.waits] + [(-1, 0)] * (abi.MAX_WAITS - len(t.waits)), where
        got = s.decode_params(r["params"])
        for k, v in t.params.items():
            want = float(np.float32(v)) if k in s.float_params else v
            assert got[k] == want, f"{where}: param {k} packed as {got[k]!r}, expected {want!r}"
        for st in r["streams"][:r["n_streams"]]:
            b = int(st["buffer"])
            kind = BufferKind.KV_CACHE if int(st["index_slot"]) == abi.STREAM_HISTORY else BufferKind.WEIGHT
            assert pk.buffers[b]["kind"] == kind and b in t.inputs, f"{where}: stream of {pk.names[b]}"
            end = int(st["byte_offset"]) + int(st["byte_count"])
            assert end <= int(pk.buffers[b]["nbytes"]), f"{where}: stream ends at byte {end}, past {pk.names[b]}"


def _acquired(p, pk) -> set[int]:
    """The counters some wait on the GPU acquires: a task's unpolled wait, a stream's wait (the loader's), an
    inline task's wait, and the step counter (the next-token writer's signal, waited on by the next step's roots)."""
    out = {w.counter for t in p.tasks for w in t.waits if not w.polled}
    out |= {t.waits[0].counter for t in p.tasks if t.inline}
    out |= {t.signal for t in p.tasks if any(x.role == NEXT_TOKEN for x in spec(t.opcode).outputs)}
    for i, t in enumerate(p.tasks):
        r = pk.instrs[i]
        out |= {t.waits[int(st["index_wait"])].counter for st in r["streams"][:r["n_streams"]]
                if int(st["index_slot"]) != abi.NO_INDEX}
    return out


@pytest.mark.parametrize("tagged,q_counter", [(True, False), (False, False), (True, True)])
def test_relaxed_signals_exactly_where_no_wait_acquires(tagged, q_counter):
    """INSTR_SIGNAL_RELAXED (the kernel's increment without a release) is set on exactly the tasks whose counter
    no GPU wait acquires. With tagged hand-offs (the default) the residual and FFN tiles get it, and the q tiles
    once q has a counter of its own (q_counter); the k/v tiles, whose counter the loader's history streams
    acquire, never do; without tagged buffers no wait is polled and none does."""
    p = lower(ODD, ScheduleConfig(dtype="bf16", capacity=40, n_sms=7, tagged=tagged, q_counter=q_counter))
    pk = pack(p, assign(p, 7))
    acquired = _acquired(p, pk)
    relaxed = (pk.instrs["flags"] & abi.INSTR_SIGNAL_RELAXED) != 0
    for i, t in enumerate(p.tasks):
        assert bool(relaxed[i]) == (t.signal >= 0 and t.signal not in acquired), p.describe_task(i)
    names = {spec(t.opcode).name for i, t in enumerate(p.tasks) if relaxed[i]}
    assert names == ({"EMBED", "ATTN_PARTIAL", "LINEAR_RESIDUAL", "RMS_GLU"} | ({"RMS_LINEAR_ROPE"} if q_counter else set())
                     if tagged else set())
    assert not any(relaxed[i] for i, t in enumerate(p.tasks) if spec(t.opcode).name == "RMS_LINEAR_KV")
    unpack(pk)                                               # pack's own flags pass unpack's check


@pytest.mark.parametrize("kw", [{}, {"fuse_argmax": False}, {"sample": True}, {"tagged": False}])
def test_last_stage_is_the_lm_head(kw):
    """INSTR_LAST_STAGE (MVM_LAST_INFLIGHT copies in flight) is set on exactly the tasks that stream weights with
    no streaming task among their descendants (networkx over the task graph): the LM head's tiles, in its argmax,
    logits and sampling forms."""
    p = lower(ODD, ScheduleConfig(dtype="bf16", capacity=40, n_sms=7, **kw))
    pk = pack(p, assign(p, 7))
    g = nx.DiGraph()
    g.add_nodes_from(range(len(p.tasks)))
    waiters = {}
    for i, t in enumerate(p.tasks):
        for w in t.waits:
            waiters.setdefault(w.counter, []).append(i)
    g.add_edges_from((i, j) for i, t in enumerate(p.tasks) for j in waiters.get(t.signal, []))
    streams = pk.instrs["n_streams"] > 0
    last = (pk.instrs["flags"] & abi.INSTR_LAST_STAGE) != 0
    for i in range(len(p.tasks)):
        assert bool(last[i]) == (streams[i] and not any(streams[j] for j in nx.descendants(g, i))), p.describe_task(i)
    assert {p.tasks[i].label.split("[")[0] for i in np.flatnonzero(last)} == {"lm_head"}
    unpack(pk)


def test_forged_relaxed_signal_refused():
    """A packed table that marks relaxed a signal some wait acquires (the k/v tiles': the partials wait on it) is
    refused by name: run, its partials could read KV rows before they land."""
    p = lower(ODD, ScheduleConfig(dtype="bf16", capacity=40, n_sms=7))
    pk = pack(p, assign(p, 7))
    i = next(i for i, t in enumerate(p.tasks) if spec(t.opcode).name == "RMS_LINEAR_KV")
    pk.instrs["flags"][i] |= abi.INSTR_SIGNAL_RELAXED
    with pytest.raises(ValueError, match=r"signals counter \d+ relaxed \(INSTR_SIGNAL_RELAXED\), but a wait on the GPU"):
        unpack(pk)


def test_limits_refused_with_names():
    p = Program()
    p.add_buffer("five_d", BufferKind.ACTIVATION, DType.F32, (1, 1, 1, 1, 2))
    with pytest.raises(ValueError, match=f"buffer 'five_d' has 5 dims; the ABI holds {abi.MAX_DIMS}"):
        pack(p, [[]])
