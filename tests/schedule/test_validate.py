"""Validator rules: each fires on a minimal bad program; valid programs (hand-built, random, lowered)
pass; happens-before matches a brute-force transitive closure."""
import random
from dataclasses import replace

import networkx as nx
import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from megavm.core.types import Buffer, DType
from megavm.core.types import BufferKind as K
from megavm.fuzz import MUTATIONS, Node, random_queues, shuffled, small_program
from megavm.instructions import Op, spec
from megavm.instructions.spec import ABSENT
from megavm.schedule.assign import assign
from megavm.schedule.config import ScheduleConfig
from megavm.schedule.ir import Program, Task, Wait
from megavm.schedule.lower import lower
from megavm.schedule.models import PRESETS
from megavm.schedule.rules import Facts
from megavm.schedule.validate import RULES, ValidationError, check, validate


def two_stage() -> Program:
    """embed -> x[8] -> two RMS_LINEAR tiles over a 16x8 weight -> y[16] -> one tile -> z[8] (OUTPUT)."""
    p = Program()
    table = p.add_buffer("table", K.WEIGHT, DType.F32, (16, 8))
    token = p.add_buffer("token", K.INPUT, DType.I32, (1,))
    x = p.add_buffer("x", K.ACTIVATION, DType.F32, (8,))
    g1 = p.add_buffer("g1", K.WEIGHT, DType.F32, (8,))
    w1 = p.add_buffer("w1", K.WEIGHT, DType.F32, (16, 8))
    y = p.add_buffer("y", K.ACTIVATION, DType.F32, (16,))
    g2 = p.add_buffer("g2", K.WEIGHT, DType.F32, (16,))
    w2 = p.add_buffer("w2", K.WEIGHT, DType.F32, (8, 16))
    z = p.add_buffer("z", K.OUTPUT, DType.F32, (8,))
    cx, cy, cz = p.add_counter("x"), p.add_counter("y"), p.add_counter("z")
    p.add_task(Task(Op.EMBED, (table, token), (x,), (), cx, {"col0": 0, "ncols": 8, "scale": 1.0}, "embed"))
    for r0 in (0, 8):
        p.add_task(Task(Op.RMS_LINEAR, (x, g1, w1), (y,), (Wait(cx, 1),), cy,
                        {"row0": r0, "nrows": 8, "eps": 1e-5, "norm": 1}, f"y[{r0}]"))
    p.add_task(Task(Op.RMS_LINEAR, (y, g2, w2), (z,), (Wait(cy, 2),), cz, {"row0": 0, "nrows": 8, "eps": 1e-5, "norm": 1}, "z"))
    return p


def with_task(p: Program, i: int, **changes) -> Program:
    tasks = list(p.tasks)
    tasks[i] = replace(tasks[i], **changes)
    return replace(p, tasks=tasks)


def fired(p: Program, queues=None) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for prob in validate(p, queues).problems:
        out.setdefault(prob.rule, []).append(prob.message)
    return out


def assert_fires(p: Program, rule: str, *words: str, queues=None) -> list[str]:
    got = fired(p, queues)
    assert rule in got, f"{rule} did not fire; got {got}"
    text = "\n".join(got[rule])
    for w in words:
        assert w in text, f"{w!r} not in {rule} messages:\n{text}"
    return got[rule]


# -- valid programs -----------------------------------------------------------------------------
def test_two_stage_is_valid():
    r = check(two_stage(), [[0, 1], [2, 3]])
    assert r.ok and [n for n, _ in RULES] == r.rules_run, str(r)
    assert "valid" in str(r)


@pytest.mark.parametrize("n_sms,strategy,capacity",
                         [(1, "balanced", 16), (3, "round_robin", 40), (132, "balanced", 512)])
def test_lowered_tiny_is_valid(n_sms, strategy, capacity):
    p = lower(PRESETS["tiny"], ScheduleConfig(capacity=capacity, n_sms=n_sms))
    r = validate(p, assign(p, n_sms, strategy))
    assert r.ok, f"{n_sms=}, {strategy=}\n{r}"


def test_lowered_small_is_valid_and_fully_checked():
    p = lower(PRESETS["small"], ScheduleConfig(capacity=1024))
    r = validate(p, assign(p, 132))
    assert r.ok and not r.notes and len(r.rules_run) == len(RULES), str(r)


# -- rules, one bad program each ----------------------------------------------------------------
def test_ids_in_range():
    p = two_stage()
    assert_fires(with_task(p, 1, inputs=(99, 3, 4)), "ids_in_range", "task 1 (y[0], RMS_LINEAR)", "buffer id 99")
    assert_fires(with_task(p, 1, waits=(Wait(7, 1),)), "ids_in_range", "counter id 7")
    assert_fires(with_task(p, 3, signal=5), "ids_in_range", "signals counter id 5")
    got = fired(with_task(p, 3, opcode=77))
    assert "unknown opcode 77" in got["ids_in_range"][0] and "opcode 77" in got["ids_in_range"][0]
    assert "arity" not in got   # later rules skipped, not crashed


def test_abi_limits():
    p = two_stage()
    five = tuple(Wait(0, 1) for _ in range(5))
    assert_fires(with_task(p, 1, waits=five), "abi_limits", "task 1 (y[0], RMS_LINEAR)", "5 waits")
    p.add_buffer("huge", K.ACTIVATION, DType.F32, (1, 1, 1, 1, 2))
    assert_fires(p, "abi_limits", "buffer 'huge'")


def test_arity():
    p = two_stage()
    assert_fires(with_task(p, 1, inputs=(2, 3)), "arity", "task 1 (y[0], RMS_LINEAR)", "2 inputs")
    assert_fires(with_task(p, 1, inputs=(2, 2, 4)), "arity", "'gamma' is buffer 'x' of kind ACTIVATION")
    xi = p.add_buffer("xi", K.ACTIVATION, DType.I32, (8,))
    assert_fires(with_task(p, 1, inputs=(xi, 3, 4)), "arity", "'x' is buffer 'xi' of dtype I32")


def test_params():
    p = two_stage()
    prm = p.tasks[1].params
    assert_fires(with_task(p, 1, params={"row0": 0, "nrows": 8}), "params", "task 1 (y[0], RMS_LINEAR)",
                 "missing param 'eps'")
    assert_fires(with_task(p, 1, params={**prm, "bias": 1}), "params", "unknown param 'bias'")
    assert_fires(with_task(p, 1, params={**prm, "row0": 0.5}), "params", "row0=0.5")
    assert_fires(with_task(p, 1, params={**prm, "row0": 12}), "params", "rows [12, 20) outside w", "w='w1'")
    assert_fires(with_task(p, 1, params={**prm, "nrows": 300}), "params", "exceeds tile capacity")
    for eps in (1e308, float("nan")):          # an f32 param must fit the f32 its word holds
        assert_fires(with_task(p, 1, params={**prm, "eps": eps}), "params", f"eps={eps!r} must be a finite number an f32")


def test_wait_satisfiable():
    p = two_stage()
    assert_fires(with_task(p, 3, waits=(Wait(1, 3),)), "wait_satisfiable", "task 3 (z, RMS_LINEAR)",
                 "counter 'y' (#1) >= 3", "2 producers")
    assert_fires(with_task(p, 1, waits=(Wait(0, 0),)), "wait_satisfiable", ">= 0")
    assert_fires(with_task(p, 3, waits=(Wait(2, 1),)), "wait_satisfiable", "counter 'z' (#2), which it signals itself")
    p.add_counter("lonely")
    assert_fires(with_task(p, 3, waits=(Wait(3, 1),)), "wait_satisfiable", "'lonely' (#3), which no task signals")


def test_all_join():
    got = assert_fires(with_task(two_stage(), 3, waits=(Wait(1, 1),)), "all_join", "task 3 (z, RMS_LINEAR)",
                       "counter 'y' (#1) >= 1", "threshold 2")
    assert len(got) == 1


def test_acyclic():
    (msg,) = assert_fires(with_task(two_stage(), 0, waits=(Wait(2, 1),)), "acyclic", "cycle: ")
    for part in ("task 0 (embed, EMBED)", "counter 'x' (#0)", "task 3 (z, RMS_LINEAR)", "counter 'z' (#2)"):
        assert part in msg, msg


def test_program_order():
    p = two_stage()
    p = replace(p, tasks=[p.tasks[0], p.tasks[3], p.tasks[1], p.tasks[2]])
    got = fired(p)
    assert "acyclic" not in got
    assert_fires(p, "program_order", "task 1 (z, RMS_LINEAR)", "counter 'y' (#1)", "task 2 (y[0], RMS_LINEAR)")
    assert "read_after_write" not in got     # skipped: its windows need a topological order
    assert any("skipped read_after_write" in n for n in validate(p).notes)


def test_read_only():
    p = two_stage()
    assert_fires(with_task(p, 1, outputs=(4,)), "read_only", "task 1 (y[0], RMS_LINEAR)", "'w1' of kind WEIGHT")
    assert_fires(with_task(p, 0, outputs=(1,)), "read_only", "'token' of kind INPUT")


def test_read_after_write_missing_wait():
    assert_fires(with_task(two_stage(), 2, waits=()), "read_after_write", "buffer 'x'",
                 "task 2 (y[8], RMS_LINEAR) reads [0:8]", "task 0 (embed, EMBED) writes [0:8]")


def test_read_after_write_unwritten_region():
    p = with_task(two_stage(), 0, params={"col0": 0, "ncols": 4, "scale": 1.0})
    assert_fires(p, "read_after_write", "buffer 'x'", "task 1 (y[0], RMS_LINEAR) reads [0:8], but no task writes [4:8]")
    p.add_buffer("never", K.ACTIVATION, DType.F32, (8,))
    assert_fires(with_task(p, 1, inputs=(p.buffer_id("never"), 3, 4)), "read_after_write", "no task writes [0:8]")


def test_read_after_write_overwrite_after_reader():
    """Ordered, so no race, but the reader does not see the overwrite's value: refused."""
    p = two_stage()
    p.add_task(replace(p.tasks[1], waits=(Wait(2, 1),), signal=-1, label="late"))
    got = fired(p)
    assert "no_race" not in got, got
    assert_fires(p, "read_after_write",
                 "task 3 (z, RMS_LINEAR) reads [0:16], which task 4 (late, RMS_LINEAR) writes [0:8]")


def test_no_race_overlapping_writers():
    p = two_stage()
    p.add_task(replace(p.tasks[1], params={**p.tasks[1].params, "row0": 4}, label="y[4]"))
    p = with_task(p, 3, waits=(Wait(1, 3),))
    p = replace(p, tasks=p.tasks[:3] + [p.tasks[4], p.tasks[3]])
    got = fired(p)
    assert list(got) == ["no_race"], got
    assert_fires(p, "no_race", "buffer 'y'", "task 1 (y[0], RMS_LINEAR) writes [0:8]",
                 "task 3 (y[4], RMS_LINEAR) writes [4:12]")


def kv_program(second_waits_first: bool) -> Program:
    """Two RMS_LINEAR_KV tiles appending the same KV head, ordered or not."""
    p = Program()
    p.add_buffer("table", K.WEIGHT, DType.F32, (16, 8))
    p.add_buffer("token", K.INPUT, DType.I32, (1,))
    p.add_buffer("pos", K.INPUT, DType.I32, (1,))
    x = p.add_buffer("x", K.ACTIVATION, DType.F32, (8,))
    g = p.add_buffer("g", K.WEIGHT, DType.F32, (8,))
    w = p.add_buffer("wk", K.WEIGHT, DType.F32, (8, 8))
    f = p.add_buffer("freqs", K.WEIGHT, DType.F32, (4,))
    cache = p.add_buffer("k_cache", K.KV_CACHE, DType.F32, (1, 4, 8))
    p.add_buffer("out", K.OUTPUT, DType.F32, (8,))
    cx, c1, c2 = p.add_counter("x"), p.add_counter("k1"), p.add_counter("k2")
    p.add_task(Task(Op.EMBED, (0, 1), (p.buffer_id("out"),), (), -1, {"col0": 0, "ncols": 8, "scale": 1.0}, "out"))
    p.add_task(Task(Op.EMBED, (0, 1), (x,), (), cx, {"col0": 0, "ncols": 8, "scale": 1.0}, "embed"))
    prm = {"row0": 0, "nrows": 8, "eps": 1e-5, "norm": 1, "head_dim": 8, "rope": 0}
    p.add_task(Task(Op.RMS_LINEAR_KV, (x, g, w, 2, f, ABSENT, ABSENT), (cache,), (Wait(cx, 1),), c1, prm, "k.a"))
    second = (Wait(cx, 1), Wait(c1, 1)) if second_waits_first else (Wait(cx, 1),)
    p.add_task(Task(Op.RMS_LINEAR_KV, (x, g, w, 2, f, ABSENT, ABSENT), (cache,), second, c2, prm, "k.b"))
    return p


def test_no_race_kv_cache():
    assert validate(kv_program(True)).ok, str(validate(kv_program(True)))
    assert_fires(kv_program(False), "no_race", "buffer 'k_cache'", "task 2 (k.a, RMS_LINEAR_KV) writes [0:1, 0:4, 0:8]",
                 "task 3 (k.b, RMS_LINEAR_KV) writes")


def test_outputs_written():
    p = two_stage()
    assert_fires(with_task(p, 3, params={"row0": 0, "nrows": 4, "eps": 1e-5, "norm": 1}), "outputs_written",
                 "buffer 'z' (OUTPUT): no task writes [4:8]")
    p.add_buffer("logits", K.OUTPUT, DType.F32, (4,))
    assert_fires(p, "outputs_written", "buffer 'logits' (OUTPUT) is written by no task")


def test_queues_cover():
    p = two_stage()
    assert_fires(p, "queues_cover", "task 3 (z, RMS_LINEAR) appears in 0", queues=[[0, 1], [2]])
    assert_fires(p, "queues_cover", "task 1 (y[0], RMS_LINEAR) appears in 2", queues=[[0, 1, 3], [1, 2]])
    assert_fires(p, "queues_cover", "queue 1 position 2: task id 9", queues=[[0, 1], [2, 3, 9]])
    assert "queues_cover" not in fired(p)          # no queues given: queue rules not run


def test_queues_topological():
    p = two_stage()
    assert validate(p, [[0, 2, 1, 3]]).ok           # independent tiles may swap places in a queue
    assert_fires(p, "queues_topological",
                 "queue 1 position 0: task 3 (z, RMS_LINEAR) is queued before task 2 (y[8], RMS_LINEAR)",
                 queues=[[0, 1], [3, 2]])


# -- the runner -----------------------------------------------------------------------------------
def test_check_raises_with_report_and_str_is_bounded():
    p = two_stage()
    for i in range(30):
        p.add_buffer(f"out{i}", K.OUTPUT, DType.F32, (4,))
    with pytest.raises(ValidationError) as e:
        check(p)
    r = e.value.report
    assert not r.ok and len(r.problems) == 30 and r.seconds >= 0
    text = str(r)
    assert "30 problems" in text and "... and 10 more" in text and text.count("[outputs_written]") == 20


def test_rule_table_is_complete_and_named():
    names = [n for n, _ in RULES]
    assert len(set(names)) == len(names)
    assert all(fn.__name__ == n for n, fn in RULES), "each rule's name is its function's name"


# -- properties ---------------------------------------------------------------------------------
@st.composite
def programs(draw):
    """Random chains and diamonds behind an embedding, in a random topological order, with random
    queues appended in program order."""
    d0 = draw(st.sampled_from([8, 16, 24]))
    nodes = []
    for k in range(1, draw(st.integers(1, 5)) + 1):
        src = st.integers(0, k - 1)
        srcs = (draw(src), draw(src)) if k > 1 and draw(st.booleans()) else (draw(src),)
        nodes.append(Node(srcs, draw(st.sampled_from([8, 16, 24])), draw(st.integers(1, 24))))
    rng = random.Random(draw(st.integers(0, 1 << 16)))
    p = shuffled(small_program(d0, draw(st.integers(1, d0)), nodes), rng)
    return p, random_queues(p, draw(st.integers(1, 4)), rng), rng


@settings(max_examples=60, deadline=None)
@given(programs())
def test_random_programs_are_valid(prq):
    p, q, _ = prq
    r = validate(p, q)
    assert r.ok, str(r)


def task_graph(p: Program) -> nx.DiGraph:
    g = nx.DiGraph()
    g.add_nodes_from(range(len(p.tasks)))
    prod = p.producers()
    g.add_edges_from((a, i) for i, t in enumerate(p.tasks) for w in t.waits for a in prod[w.counter])
    return g


@settings(max_examples=40, deadline=None)
@given(programs())
def test_happens_before_matches_closure(prq):
    p, _, _ = prq
    closure = nx.transitive_closure_dag(task_graph(p))
    f = Facts(p, None)
    for b in f.accesses:
        m = np.unique(f.accesses[b].task)
        a, c = np.repeat(m, len(m)), np.tile(m, len(m))
        want = np.array([closure.has_edge(int(x), int(y)) for x, y in zip(a, c)])
        got = f.ancestry(b).before(a, c)
        assert (got == want).all(), f"buffer {p.buffers[b].name}"


def test_partial_wait_orders_nothing():
    """A wait below the producer count says nothing about which producers finished."""
    y = 5
    full = Facts(two_stage(), None).ancestry(y)
    part = Facts(with_task(two_stage(), 3, waits=(Wait(1, 1),)), None).ancestry(y)
    a, b = np.array([1, 2]), np.array([3, 3])
    assert full.before(a, b).tolist() == [True, True]
    assert part.before(a, b).tolist() == [False, False]


def dropped_wait_is_implied(p: Program, mutant: Program) -> bool:
    """A dropped wait changes nothing when every producer it waited for is still an ancestor."""
    i = next(k for k, (s, t) in enumerate(zip(p.tasks, mutant.tasks)) if s.waits != t.waits)
    lost = set(p.tasks[i].waits) - set(mutant.tasks[i].waits)
    anc = nx.ancestors(task_graph(mutant), i)
    prod = p.producers()
    return all(set(prod[w.counter]) <= anc for w in lost)


# expert_ids_early needs MoE (test_moe.py), history_early attention (test_history.py), inline_early a
# task that streams nothing (test_inline.py), amax_early a quantized KV cache (test_kv_fp8.py),
# untag_read tagged buffers (test_tagging.py)
@pytest.mark.parametrize("kind", [k for k in MUTATIONS if k not in ("expert_ids_early", "history_early", "inline_early",
                                                                    "amax_early", "untag_read")])
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
@given(prq=programs())
def test_every_mutation_is_rejected(kind, prq):
    p, q, rng = prq
    mutant = MUTATIONS[kind](p, q, rng)
    assume(mutant is not None)
    mp, mq, what = mutant
    if kind == "drop_wait":
        assume(not dropped_wait_is_implied(p, mp))
    r = validate(mp, mq)
    assert not r.ok, f"{kind}: {what} was accepted"
    assert validate(p, q).ok, "the mutation changed the original program"


LIN = {"row0": 0, "nrows": 4, "b0": 0, "nb": 1, "act": 0, "mult": 0.0}


def _check(op, params, ins, outs) -> list[str]:
    """The spec's shape check on f32 operands of these shapes."""
    bufs = lambda shapes: [None if s is None else Buffer(f"b{i}", K.ACTIVATION, DType.F32, tuple(s))  # noqa: E731
                           for i, s in enumerate(shapes)]
    return spec(op).check(params, bufs(ins), bufs(outs))


@pytest.mark.parametrize("op,params,ins,outs,words", [
    (Op.RMSNORM, {"eps": 1e-5}, [(4, 8), (8,)], [(8,)], "x must be a vector, has shape (4, 8)"),
    (Op.RMSNORM, {"eps": 1e-5}, [(8,), (16,)], [(8,)], "gamma has shape (16,), expected (8,)"),
    (Op.ADD, {"row0": 4, "nrows": 8}, [(8,), (8,)], [(8,)], "rows [4, 12) outside a of 8 elements"),
    (Op.ADD, {"row0": 0, "nrows": 8}, [(8,), (4,)], [(8,)], "b has shape (4,), expected (8,)"),
    (Op.LINEAR, LIN, [(16,), (8, 8), None, None], [(8,)], "x has shape (16,), expected (8,) or (batch, 8)"),
    (Op.LINEAR, LIN, [(2, 3, 8), (8, 8), None, None], [(8,)], "x has shape (2, 3, 8)"),
    (Op.LINEAR, LIN, [(8,), (8, 8), None, None], [(4, 8)], "y has shape (4, 8), expected (8,)"),
    (Op.LINEAR, {**LIN, "b0": 3, "nb": 2}, [(4, 8), (10, 8), None, None], [(4, 10)], "batch rows [3, 5) outside x's 4"),
    (Op.LINEAR, LIN, [(4, 8), (10, 8), (8,), None], [(4, 10)], "bias has shape (8,), expected (10,)"),
    (Op.LINEAR, LIN, [(4, 8), (10, 8), None, (10,)], [(4, 10)], "res has shape (10,), expected (4, 10)"),
    (Op.LINEAR, {**LIN, "act": 6}, [(8,), (8, 8), None, None], [(8,)], "act=6 is not an activation code"),
    (Op.LINEAR, {**LIN, "mult": float("inf")}, [(8,), (8, 8), None, None], [(8,)], "mult=inf must be finite"),
    (Op.LINEAR, LIN, [(4, 12), (10, 12), None, None], [(4, 10)], "K=12 must be a multiple of 8"),
    (Op.ROPE, {"row0": 1, "nrows": 4, "head_dim": 8}, [(16,), (1,), (4,), None, None], [(16,)], "whole row pairs"),
    (Op.ROPE, {"row0": 0, "nrows": 4, "head_dim": 8}, [(16,), (1,), (3,), None, None], [(16,)], "freqs has shape (3,), expected (4,)"),
    (Op.ROPE, {"row0": 0, "nrows": 4, "head_dim": 8}, [(16,), (1,), (4,), None, None], [(8,)], "y has shape (8,), expected (16,)"),
    (Op.KV_APPEND, {"row0": 0, "nrows": 8, "head_dim": 8, "rope": 2}, [(16,), (1,), (4,), None, None], [(2, 4, 8)], "rope=2"),
    (Op.KV_APPEND, {"row0": 12, "nrows": 8, "head_dim": 8, "rope": 0}, [(16,), (1,), (4,), None, None], [(2, 4, 8)],
     "rows [12, 20) outside a of 16 elements"),
    (Op.KV_APPEND, {"row0": 0, "nrows": 8, "head_dim": 8, "rope": 1}, [(24,), (1,), (4,), None, None], [(2, 4, 8)],
     "a has 24 elements, cache holds 2x8"),
    (Op.ROPE, {"row0": 0, "nrows": 8, "head_dim": 8}, [(16,), (1,), (4,), (8,), None], [(16,)],
     "bias has shape (8,), expected (16,)"),
    (Op.ROPE, {"row0": 0, "nrows": 12, "head_dim": 8}, [(16,), (1,), (4,), None, (8,)], [(16,)],
     "rows [0, 12) must be whole heads of 8 for a head norm"),
    (Op.ROPE, {"row0": 0, "nrows": 8, "head_dim": 8}, [(16,), (1,), (4,), None, (4,)], [(16,)],
     "head_norm has shape (4,), expected (8,)"),
    (Op.ROPE, {"row0": 0, "nrows": 512, "head_dim": 8}, [(512,), (1,), (4,), None, (8,)], [(512,)],
     "nrows=512 over 256 for rows with a bias or head norm"),
    (Op.KV_APPEND, {"row0": 4, "nrows": 8, "head_dim": 8, "rope": 1}, [(16,), (1,), (4,), None, (8,)], [(2, 4, 8)],
     "rows [4, 12) must be whole heads of 8 for a head norm"),
    (Op.ARGMAX, {}, [(4, 3)], [(1,)], "expected (tiles, 2) partials or a (vocab,) vector of logits"),
])
def test_unfused_opcode_checks_name_the_problem(op, params, ins, outs, words):
    """The fusion ablations' opcodes refuse bad shapes and ranges with a message naming the operand."""
    problems = _check(op, params, ins, outs)
    assert any(words in m for m in problems), f"{op.name}: {problems}"


def test_unfused_opcode_checks_pass_good_operands():
    assert _check(Op.ROPE, {"row0": 8, "nrows": 8, "head_dim": 8}, [(16,), (1,), (4,), None, None], [(16,)]) == []
    assert _check(Op.KV_APPEND, {"row0": 0, "nrows": 8, "head_dim": 8, "rope": 0}, [(16,), (1,), (4,), None, None],
                  [(2, 4, 8)]) == []
    assert _check(Op.ROPE, {"row0": 8, "nrows": 8, "head_dim": 8}, [(16,), (1,), (4,), (16,), (8,)], [(16,)]) == []
    assert _check(Op.KV_APPEND, {"row0": 8, "nrows": 8, "head_dim": 8, "rope": 1}, [(16,), (1,), (4,), None, (8,)],
                  [(2, 4, 8)]) == []
    assert _check(Op.ADD, {"row0": 0, "nrows": 8}, [(8,), (8,)], [(8,)]) == []
    assert _check(Op.ARGMAX, {}, [(1000,)], [(1,)]) == []
    assert _check(Op.LINEAR, {**LIN, "b0": 2, "nb": 2, "act": 5, "mult": -0.5}, [(4, 8), (10, 8), (10,), (4, 10)],
                  [(4, 10)]) == []
