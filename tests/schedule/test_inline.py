"""Inline tasks: in no queue, run by the task whose signal completes their one wait (the combine of
a head run on the SM of its last partial: ScheduleConfig(inline_combine=True)). The IR and its JSON,
the validator's rules, assignment, the packed tables, and ReferenceVM against the eager model."""

import random
from dataclasses import replace

import numpy as np
import pytest
import torch

from megavm.core import abi
from megavm.core.errors import ConfigError, UserError
from megavm.fuzz import inline_early
from megavm.instructions import Op
from megavm.schedule import ir_json
from megavm.schedule.assign import assign, predicted_ns
from megavm.schedule.config import ScheduleConfig
from megavm.schedule.eager import EagerDecoder
from megavm.schedule.ir import Program, Wait
from megavm.schedule.lower import lower
from megavm.schedule.models import PRESETS, ModelConfig
from megavm.schedule.validate import validate
from megavm.schedule.weights import program_weights, random_hf_weights
from megavm.vm.megakernel import MegakernelVM
from megavm.vm.pack import pack, unpack
from megavm.vm.reference import ReferenceVM
from megavm.vm.verify import VS_EAGER

TINY = PRESETS["tiny"]
HD64 = ModelConfig(dim=256, n_layers=2, n_heads=8, n_kv_heads=2, head_dim=64, ffn_dim=384, vocab=256)
N_SMS = 8


def _program(cfg=TINY, dtype="f32", **changes) -> Program:
    return lower(cfg, ScheduleConfig(dtype=dtype, capacity=48, n_sms=N_SMS, **changes))


def _combines(p: Program) -> list[int]:
    return [i for i, t in enumerate(p.tasks) if t.opcode == Op.ATTN_COMBINE]


def _problems(p: Program, queues=None) -> dict[str, str]:
    out: dict[str, str] = {}
    for prob in validate(p, queues).problems:
        out[prob.rule] = out.get(prob.rule, "") + prob.message + "\n"
    return out


def test_inline_combine_lowers_to_valid_queues_without_the_combines():
    p = _program(inline_combine=True)
    inline = [i for i, t in enumerate(p.tasks) if t.inline]
    assert inline == _combines(p) and len(inline) == TINY.n_layers * TINY.n_kv_heads
    for strategy in ("balanced", "round_robin"):
        q = assign(p, N_SMS, strategy)
        assert sorted(i for queue in q for i in queue) == [i for i, t in enumerate(p.tasks) if not t.inline]
        assert validate(p, q).ok, str(validate(p, q))
        assert predicted_ns(p, q) > 0


def test_validator_refuses_what_an_inline_task_cannot_do():
    p = _program(inline_combine=True)
    c = _combines(p)[0]
    two = replace(p, tasks=[replace(t, waits=t.waits + (Wait(p.tasks[0].signal, 1),)) if i == c else t
                            for i, t in enumerate(p.tasks)])
    assert "exactly one wait" in _problems(two).get("inline", "")
    tile = next(i for i, t in enumerate(p.tasks) if t.opcode == Op.RMS_GLU)    # streams its weights
    streams = replace(p, tasks=[replace(t, inline=True) if i == tile else t for i, t in enumerate(p.tasks)])
    assert "streams weights" in _problems(streams).get("inline", "")
    q = assign(p, N_SMS)
    queued = [queue + [c] if k == 0 else queue for k, queue in enumerate(q)]
    assert "is inline" in _problems(p, queued).get("queues_cover", "")
    gone = next(i for i, t in enumerate(p.tasks) if i > c and not t.inline)    # a queued task left out
    dropped = [[i for i in queue if i != gone] for queue in q]
    assert "in 0 queue entries" in _problems(p, dropped).get("queues_cover", "")


def test_inline_early_mutants_are_refused():
    """The fuzzer's inline_early: a combine made inline with its threshold one short would run before
    its head's last partial; the validator refuses every one (all_join)."""
    p = _program()
    q = assign(p, N_SMS)
    for seed in range(8):
        mp, mq, what = inline_early(p, q, random.Random(seed))
        assert "all_join" in _problems(mp, mq), what


def test_inline_survives_json_and_the_packed_tables():
    p = _program(inline_combine=True)
    back = Program.from_json(p.to_json())
    assert [t.inline for t in back.tasks] == [t.inline for t in p.tasks]
    q = assign(p, N_SMS)
    packed = pack(p, q)
    assert [bool(f & abi.INSTR_INLINE) for f in packed.instrs["flags"]] == [t.inline for t in p.tasks]
    p2, q2 = unpack(packed)
    assert [t.inline for t in p2.tasks] == [t.inline for t in p.tasks] and q2 == q
    text = p.to_json().replace('"inline": true', '"inline": 1', 1)
    with pytest.raises(ir_json.Malformed, match="inline is an integer, not true or false"):
        Program.from_json(text)


def test_inline_combine_needs_combine_tasks():
    with pytest.raises(ConfigError, match="inline_combine"):
        _program(inline_combine=True, fuse_combine=True)


def test_megakernel_refuses_inline_tasks_in_one_line():
    p = _program(inline_combine=True)
    with pytest.raises(UserError, match=r"task \d+ \(L0\.combine\.h0, ATTN_COMBINE\) runs inline.*"
                                        r"MVM_INLINE_TASKS=1") as e:
        MegakernelVM(pack(p, assign(p, N_SMS)), {})
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("cfg, dtype", [(TINY, "f32"), (TINY, "bf16"), (HD64, "bf16")],
                         ids=["tiny-f32", "tiny-bf16", "hd64-bf16"])
def test_inline_combine_decodes_as_the_eager_model_and_as_queued_combines(cfg, dtype):
    """Greedy steps under ReferenceVM's checking mode and seeded interleavings: the tokens of the eager
    model, logits within its tolerance, and bit for bit those of the same program with queued combines
    (inline changes where and when a combine runs, not its arithmetic)."""
    hf = random_hf_weights(cfg, {"f32": torch.float32, "bf16": torch.bfloat16}[dtype], seed=7)
    w = program_weights(cfg, hf)
    tol = VS_EAGER[dtype]
    for seed in (None, 1, 4):
        vms = [ReferenceVM(pack(p, assign(p, N_SMS)), w, check=True, seed=seed)
               for p in (_program(cfg, dtype, inline_combine=True), _program(cfg, dtype))]
        eager = EagerDecoder(cfg, hf, 48)
        tok = 3
        for pos in range(5):
            a, b = (vm.step({"token": tok, "pos": pos}) for vm in vms)
            e = eager.step(tok, pos)
            assert torch.equal(a["logits"], b["logits"]), f"{seed=} {pos=}"
            assert tol.error(a["logits"], e) <= tol.value, f"{seed=} {pos=}"
            assert int(a["next_token"][0]) == int(e.argmax()), f"{seed=} {pos=}"
            tok = int(e.argmax())
        combines = {int(i) for i in np.flatnonzero(vms[0].p.instrs["flags"] & abi.INSTR_INLINE)}
        assert combines and combines <= set(vms[0].trace)
