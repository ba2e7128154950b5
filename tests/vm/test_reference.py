"""ReferenceVM against the eager model, under seeded interleavings, in checking mode, on broken programs
and on bad runtime inputs."""

import pytest
import torch

from megavm.core.errors import DeadlockError, InputError, RaceError
from megavm.core.types import BufferKind
from megavm.instructions import Op
from megavm.schedule.assign import assign
from megavm.schedule.config import ScheduleConfig
from megavm.schedule.eager import EagerDecoder
from megavm.schedule.ir import Wait
from megavm.schedule.lower import lower
from megavm.schedule.models import PRESETS
from megavm.schedule.weights import program_weights, random_hf_weights
from megavm.vm.pack import pack
from megavm.vm.reference import ReferenceVM
from megavm.vm.verify import VS_EAGER, greedy, reference_step

CFG = PRESETS["tiny"]
CAP, N_SMS, TOKENS, PROMPT = 48, 8, 32, [3, 1, 4]


@pytest.fixture(scope="module", params=["f32", "bf16"])
def setup(request):
    dt = request.param
    hf = random_hf_weights(CFG, {"f32": torch.float32, "bf16": torch.bfloat16}[dt], seed=7)
    p = lower(CFG, ScheduleConfig(dtype=dt, capacity=CAP, n_sms=N_SMS))
    q = assign(p, N_SMS)
    tokens, logits = EagerDecoder(CFG, hf, CAP).generate(PROMPT, TOKENS)
    return dt, p, q, pack(p, q), program_weights(CFG, hf), tokens, logits


@pytest.fixture(scope="module")
def default_order(setup):
    _, _, _, pk, w, _, _ = setup
    return greedy(reference_step(ReferenceVM(pk, w)), PROMPT, TOKENS)


def _check_against_eager(dt, vm, tokens, logits, what):
    got = greedy(reference_step(vm), PROMPT, TOKENS)
    assert got.tokens == tokens, f"{dt} {what}: tokens {got.tokens} != eager {tokens}"
    tol = VS_EAGER[dt]
    for pos, (a, b) in enumerate(zip(got.logits, logits)):
        err = tol.error(a, b)
        assert err <= tol.value, f"{dt} {what}: {pos=}, {tol.describe(err)}"
    return got


def test_greedy_matches_eager(setup):
    dt, _, _, pk, w, tokens, logits = setup
    _check_against_eager(dt, ReferenceVM(pk, w), tokens, logits, "default order")


@pytest.mark.parametrize("seed", range(5))
def test_seeded_interleavings_match_eager_bitwise_equal(setup, default_order, seed):
    """Any interleaving gives bitwise the same logits (no order-dependent reductions)."""
    dt, _, _, pk, w, tokens, logits = setup
    base = default_order
    got = _check_against_eager(dt, ReferenceVM(pk, w, check=True, seed=seed), tokens, logits, f"{seed=}")
    for pos, (a, b) in enumerate(zip(got.logits, base.logits)):
        assert torch.equal(a, b), f"{dt} {seed=} {pos=}: logits differ from the default order by {(a - b).abs().max():.2e}"


@pytest.mark.parametrize("strategy", ["balanced", "round_robin"])
@pytest.mark.parametrize("n_sms", [1, 5, 64])
def test_checking_mode_passes_valid_programs(strategy, n_sms):
    hf = random_hf_weights(CFG, torch.float32, seed=1)
    p = lower(CFG, ScheduleConfig(dtype="f32", capacity=16, n_sms=n_sms))
    vm = ReferenceVM(pack(p, assign(p, n_sms, strategy)), program_weights(CFG, hf), check=True, seed=n_sms)
    eager = EagerDecoder(CFG, hf, 16)
    for pos, tok in enumerate([5, 9, 2, 7]):
        out = vm.step({"token": tok, "pos": pos})
        err = (out["logits"] - eager.step(tok, pos)).abs().max().item()
        assert err <= 1e-4, f"{strategy=}, {n_sms=}, {pos=}: {err=:.2e}"
    assert sorted(vm.trace) == list(range(len(p.tasks))), f"{strategy=}, {n_sms=}: not every task ran once"


def _broken(edit, first: bool = False):
    """tiny f32 with one task edited; one queue per task so the edited task heads its own queue (queue 0
    with `first`, so that it is the first queue ReferenceVM runs without a seed)."""
    p = lower(CFG, ScheduleConfig(dtype="f32", capacity=16, n_sms=8, fuse_combine=False, attn_direct=False))
    victim = next(i for i, t in enumerate(p.tasks) if t.opcode == Op.ATTN_COMBINE)
    edit(p.tasks[victim])
    queues = assign(p, len(p.tasks), "round_robin")
    if first:
        queues = [[victim]] + [q for q in queues if q != [victim]]
    w = program_weights(CFG, random_hf_weights(CFG, torch.float32, seed=1))
    return p, victim, pack(p, queues), w


def test_dropped_wait_is_caught():
    """The combine without its wait heads queue 0, so it runs before the partials it reads: check mode
    flags the read. (With a seed the interleaving is random, and one where the partials happen to finish
    first has no race to flag: ReferenceVM checks the order that ran; the validator checks the waits.)"""
    p, victim, pk, w = _broken(lambda t: setattr(t, "waits", ()), first=True)
    vm = ReferenceVM(pk, w, check=True)
    with pytest.raises((RaceError, DeadlockError)) as e:
        vm.step({"token": 1, "pos": 0})
    assert f"task {victim} (ATTN_COMBINE" in str(e.value) and "part.0" in str(e.value), \
        f"message names neither task nor buffer: {e.value}"


def test_deadlock_names_blocked_queue_heads_and_counters():
    def raise_threshold(t):
        t.waits = (Wait(t.waits[0].counter, t.waits[0].threshold + 1),)
    p, victim, pk, w = _broken(raise_threshold)
    c, th = p.tasks[victim].waits[0].counter, p.tasks[victim].waits[0].threshold
    with pytest.raises(DeadlockError) as e:
        ReferenceVM(pk, w).step({"token": 1, "pos": 0})
    msg = str(e.value)
    # one queue per task (round robin over len(tasks) queues): the victim heads queue `victim`
    assert f"queue {victim} head 0: task {victim} (ATTN_COMBINE) waits on counter {c} ({p.counters[c].name}) = {th - 1} < {th}" in msg, msg
    assert "instructions cannot run" in msg


def _kv(vm):
    return {vm.p.names[i]: t.clone() for i, t in vm.t.items() if vm.p.buffers[i]["kind"] == BufferKind.KV_CACHE}


@pytest.mark.parametrize("inputs, message", [
    ({"token": CFG.vocab, "pos": 2}, f"token id {CFG.vocab} for input 'token' is outside \\[0, {CFG.vocab}\\)"),
    ({"token": -1, "pos": 2}, "token id -1"),
    ({"token": 1, "pos": CAP}, f"position {CAP} for input 'pos' is outside \\[0, {CAP}\\)"),
    ({"token": 1}, "missing runtime inputs \\['pos'\\]"),
    ({"token": 1, "pos": 0, "temperature": 1}, "unknown runtime inputs"),
    ({"token": 1.5, "pos": 0}, "must be an int"),
])
def test_bad_inputs_raise_and_leave_the_cache_alone(setup, inputs, message):
    _, _, _, pk, w, _, _ = setup
    vm = ReferenceVM(pk, w)
    for pos, tok in enumerate(PROMPT):
        vm.step({"token": tok, "pos": pos})
    before = _kv(vm)
    assert any(t.abs().sum() > 0 for t in before.values())
    with pytest.raises(InputError, match=message):
        vm.step(inputs)
    after = _kv(vm)
    for name in before:
        assert torch.equal(before[name], after[name]), f"{inputs=}: {name} changed"
    assert vm.steps == len(PROMPT)
