"""Mixture-of-experts lowering: router tiles, ROUTE, expert tiles with late-bound weight streams, the
validator's rule for those streams, the packed stream fields, and the bytes a step reads (the chosen
experts only). The decode itself is checked against transformers in test_families.py
(tests/hf_families.py's qwen3-moe cases)."""
import random
from dataclasses import replace

import pytest

from megavm.core import abi
from megavm.core.errors import ConfigError
from megavm.fuzz import expert_ids_early, random_weights, run_checked
from megavm.instructions import Op
from megavm.schedule.assign import assign
from megavm.schedule.config import ScheduleConfig
from megavm.schedule.ir import Wait
from megavm.schedule.lower import lower
from megavm.schedule.models import PRESETS
from megavm.schedule.validate import validate
from megavm.vm.pack import pack

CFG = PRESETS["moe-tiny"]          # 3 layers, layer 1 dense; 8 experts choose 2, width 32
SC = ScheduleConfig(dtype="f32", capacity=32, n_sms=4)


def _ops(p, op):
    return [i for i, t in enumerate(p.tasks) if t.opcode == op]


def test_lowering_structure_and_validity():
    p = lower(CFG, SC)
    assert validate(p, assign(p, 4)).ok
    moe_layers = [l for l in range(CFG.n_layers) if CFG.is_moe(l)]
    assert moe_layers == [0, 2]
    assert len(_ops(p, Op.ROUTE)) == 2
    assert len(_ops(p, Op.RMS_GLU)) > 0                                  # the dense layer keeps its MLP
    glu = _ops(p, Op.EXPERT_GLU)
    assert sorted({p.tasks[i].params["slot"] for i in glu}) == list(range(CFG.top_k))
    names = {b.name for b in p.buffers}
    assert {"layers.0.experts_gate", "layers.2.experts_down", "expert_ids.0"} <= names
    assert "layers.0.w_gate" not in names and "layers.1.w_gate" in names


def test_expert_streams_are_late_bound_on_route():
    p = lower(CFG, SC)
    packed = pack(p, assign(p, 4))
    route = {p.tasks[i].signal for i in _ops(p, Op.ROUTE)}
    for op, runs in ((Op.EXPERT_GLU, 1), (Op.EXPERT_DOWN, CFG.top_k)):
        for i in _ops(p, op):
            r = packed.instrs[i]
            for st in r["streams"][:r["n_streams"]]:
                assert int(st["index_slot"]) >= 0 and int(st["index_count"]) == runs
                w = r["waits"][int(st["index_wait"])]
                assert int(w["counter"]) in route and int(w["threshold"]) == 1
    dense = _ops(p, Op.RMS_GLU)[0]
    assert (packed.instrs[dense]["streams"]["index_slot"] == abi.NO_INDEX).all()


def test_bytes_per_step_are_the_chosen_experts_only():
    cfg = replace(CFG, n_layers=1, dense_layers=(), dim=1024, expert_ffn=512)
    p = lower(cfg, replace(SC, dtype="bf16"))
    e = cfg.expert_ffn * cfg.dim * 2                    # one expert matrix, bf16 (activations: the other < 10%)
    glu = sum(p.tasks[i].est_bytes for i in _ops(p, Op.EXPERT_GLU))
    down = sum(p.tasks[i].est_bytes for i in _ops(p, Op.EXPERT_DOWN))
    assert 2 * CFG.top_k * e <= glu < 2 * CFG.top_k * e * 1.1
    assert CFG.top_k * e <= down < CFG.top_k * e * 1.1


@pytest.mark.parametrize("op,tag_h", [(Op.EXPERT_GLU, True), (Op.EXPERT_DOWN, True), (Op.EXPERT_DOWN, False)])
def test_validator_refuses_expert_ids_read_early(op, tag_h):
    """The router wait moved to the router's logits: for EXPERT_DOWN with h plain, its other wait (on the
    GLU tiles' counter) still orders the ids (the ReferenceVM would run it fine), but its loader reads
    them after the moved wait alone. With h tagged that wait is polled and orders nothing but h: the
    tagged rule refuses the ids' and weights' reads too."""
    p = lower(CFG, replace(SC, tag_expert_h=tag_h))
    q = assign(p, 4)
    rng = random.Random(0)
    for _ in range(50):
        m, mq, what = expert_ids_early(p, q, rng)
        if "EXPERT_DOWN" in what if op == Op.EXPERT_DOWN else "EXPERT_GLU" in what:
            break
    rep = validate(m, mq)
    rules = {pr.rule for pr in rep.problems}
    assert "late_bound" in rules, str(rep)
    if op == Op.EXPERT_DOWN:
        assert rules == ({"late_bound", "tagged"} if tag_h else {"late_bound"}), str(rep)
    err = run_checked(m, mq, random_weights(m, 0), rng)      # packing refuses it too
    assert err is not None and "expert ids" in err


def test_moe_lowering_refuses_lora():
    with pytest.raises(ConfigError, match="mixture-of-experts"):
        lower(CFG, replace(SC, lora_adapters=1, lora_rank=4, lora_targets=("q",)))


def test_route_partial_threshold_is_not_a_cover():
    p = lower(CFG, SC)
    i = _ops(p, Op.EXPERT_GLU)[0]
    t = p.tasks[i]
    tasks = list(p.tasks)
    tasks[i] = replace(t, waits=(Wait(t.waits[0].counter, 0),))
    rep = validate(replace(p, tasks=tasks))
    assert not rep.ok and "late_bound" in {pr.rule for pr in rep.problems}


def test_hash_table_ids_refused_when_weights_bind():
    from megavm.core.errors import UserError
    from megavm.vm.reference import ReferenceVM
    from tests.programs import ROUTE_K, route_logits, route_program
    packed = route_program(64, ROUTE_K, 40)
    w = route_logits(40, 64)
    ReferenceVM(packed, w).step({"token": 3})
    w["hash_table"][5, 1] = -1
    with pytest.raises(UserError, match=r"^ROUTE task \d+: hash table 'hash_table' holds expert id -1 at token 5, "
                                        r"slot 1: outside the 64 experts$"):
        ReferenceVM(packed, w)


MOE_JSON = {"model_type": "qwen3_moe", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
            "num_key_value_heads": 2, "head_dim": 16, "intermediate_size": 96, "vocab_size": 128, "num_experts": 8,
            "num_experts_per_tok": 2, "moe_intermediate_size": 32}


@pytest.mark.parametrize("change, words", [
    (dict(num_experts_per_tok=9), "num_experts_per_tok=9 must be in [1, 8]"),
    (dict(mlp_only_layers=[0, "1"]), "mlp_only_layers=[0, '1'] must be a list of layer indices in [0, 2)"),
    (dict(mlp_only_layers=[5]), "mlp_only_layers=[5]"),
    (dict(num_local_experts=16), "num_local_experts=16 disagrees with num_experts=8"),
    (dict(hidden_act="gelu"), "hidden_act='gelu' is not supported"),
    (dict(num_experts=0), "num_experts=0 must be in [1, 1024]"),
    (dict(model_type="mixtral", num_local_experts=4, num_experts_per_tok=True), "num_experts_per_tok=True must be an integer"),
])
def test_moe_config_refusals_name_the_field(change, words):
    from megavm.schedule.hf_config import parse
    with pytest.raises(ConfigError, match=words.replace("[", r"\[").replace("]", r"\]").replace("(", r"\(")
                       .replace(")", r"\)")):
        parse({**MOE_JSON, **change})


def test_moe_config_reads_dense_layers_and_the_count_transformers_saves():
    from megavm.schedule.hf_config import parse
    cfg = parse({**MOE_JSON, "num_hidden_layers": 4, "decoder_sparse_step": 2, "mlp_only_layers": [3],
                 "norm_topk_prob": True})
    assert (cfg.n_experts, cfg.top_k, cfg.expert_ffn, cfg.dense_layers, cfg.router_renorm) == (8, 2, 32, (0, 2, 3), True)
    moved = {k: v for k, v in MOE_JSON.items() if k != "num_experts"} | {"num_local_experts": 8}
    assert parse(moved).n_experts == 8


def test_expert_views_stack_without_a_copy():
    import torch

    from megavm.schedule.weights import expert_stack
    stack = torch.randn(4, 3, 8)
    assert expert_stack([stack[e] for e in range(4)]) is stack
    parts = [torch.randn(3, 8) for _ in range(4)]
    assert torch.equal(expert_stack(parts), torch.stack(parts))
    assert expert_stack([stack[e] for e in (0, 2, 1, 3)]) is not stack


def test_router_tiles_are_as_tall_as_their_bytes_allow():
    """The default router tile holds at most ROUTER_TILE_BYTES (128 KiB) of the router (its rows are in
    its ring before mid lands): qwen3-30b-a3b's 128 x 2048 bf16 router in 4 tiles of 32 rows; f32 halves the rows;
    a router smaller than that is one tile; an explicit router_rows wins."""
    from megavm.schedule.config import resolve
    big = PRESETS["qwen3-30b-a3b"]
    assert resolve(big, ScheduleConfig(dtype="bf16")).router_rows == 32
    assert resolve(big, ScheduleConfig(dtype="f32")).router_rows == 16
    assert resolve(CFG, SC).router_rows == CFG.n_experts
    assert resolve(big, ScheduleConfig(dtype="bf16", router_rows=8)).router_rows == 8
    p = lower(replace(CFG, n_layers=1, dense_layers=()), SC)
    assert len([t for t in p.tasks if ".router[" in t.label]) == 1
