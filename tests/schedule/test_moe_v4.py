"""A DeepSeek-V4-style MoE block (sqrt-softplus router with a ranking bias, hash-routed first layer,
shared expert, swiglu clamp, routed scaling) on a Llama attention, run by ReferenceVM and checked
layer by layer against transformers' own DeepseekV4SparseMoeBlock holding the same weights."""
import math

import pytest
import torch

from megavm.schedule.config import ScheduleConfig
from megavm.schedule.models import ModelConfig
from megavm.vm.compile import compile
from megavm.vm.reference import ReferenceVM

transformers = pytest.importorskip("transformers")
from transformers.models.deepseek_v4 import modeling_deepseek_v4 as v4  # noqa: E402

CFG = ModelConfig(dim=64, n_layers=3, n_heads=4, n_kv_heads=2, head_dim=16, ffn_dim=96, vocab=256,
                  n_experts=16, top_k=4, expert_ffn=32, router_score="sqrt_softplus", router_bias=True,
                  router_renorm=True, router_eps=1e-20, router_scale=1.5, hash_layers=1, shared_ffn=48,
                  swiglu_limit=0.6, dense_layers=(1,))
TOL = 1e-5                  # |megavm - transformers| <= TOL * max |block output|, f32 throughout


def program_weights(packed, seed=0):
    g = torch.Generator().manual_seed(seed)
    out = {}
    for i, r in enumerate(packed.buffers):
        if int(r["kind"]) != 0:
            continue
        name, shape = packed.names[i], packed.shape(i)
        if name.endswith("hash_table"):
            out[name] = torch.stack([torch.randperm(CFG.n_experts, generator=g)[:CFG.top_k]
                                     for _ in range(shape[0])]).int()
        elif name.endswith("router_bias"):
            out[name] = 0.2 * torch.randn(shape, generator=g)
        elif len(shape) >= 2:
            out[name] = torch.randn(shape, generator=g) / math.sqrt(shape[-1])
        else:
            out[name] = 1.0 + 0.1 * torch.randn(shape, generator=g)
    n = out["rope_freqs"].numel()
    out["rope_freqs"] = 10000.0 ** (-torch.arange(n) / n)
    return out


def v4_block(w, layer):
    conf = transformers.DeepseekV4Config(
        hidden_size=CFG.dim, intermediate_size=CFG.expert_ffn, num_local_experts=CFG.n_experts,
        num_experts_per_tok=CFG.top_k, scoring_func="sqrtsoftplus", routed_scaling_factor=CFG.router_scale,
        swiglu_limit=CFG.swiglu_limit, num_hidden_layers=CFG.n_layers, vocab_size=CFG.vocab, hidden_act="silu",
        mlp_layer_types=["hash_moe" if CFG.is_hash(l) else "moe" for l in range(CFG.n_layers)])
    assert conf.intermediate_size == CFG.expert_ffn
    blk = v4.DeepseekV4SparseMoeBlock(conf, layer).float().eval()
    L = f"layers.{layer}."
    with torch.no_grad():
        blk.gate.weight.copy_(w[L + "router"])
        if CFG.is_hash(layer):
            blk.gate.tid2eid.copy_(w[L + "hash_table"].long())
        else:
            blk.gate.e_score_correction_bias.copy_(w[L + "router_bias"])
        blk.experts.gate_up_proj.copy_(torch.cat([w[L + "experts_gate"], w[L + "experts_up"]], dim=1))
        blk.experts.down_proj.copy_(w[L + "experts_down"])
        # the shared expert is as wide as the routed ones in transformers: it gets its own width here
        sh = blk.shared_experts
        for n, src in (("gate_proj", "shared_gate"), ("up_proj", "shared_up"), ("down_proj", "shared_down")):
            setattr(sh, n, torch.nn.Linear(*reversed(w[L + src].shape), bias=False))
            getattr(sh, n).weight.copy_(w[L + src])
    return blk


def test_v4_block_matches_transformers():
    check_against_transformers(CFG)


def check_against_transformers(cfg):
    """cfg's program (CFG, or a variant of it that must fail) against the blocks of CFG."""
    packed = compile(cfg, ScheduleConfig(dtype="f32", capacity=16, n_sms=6))
    w = program_weights(compile(CFG, ScheduleConfig(dtype="f32", capacity=16, n_sms=6)))
    vm = ReferenceVM(packed, {k: v for k, v in w.items() if k in packed.names}, check=True, seed=1)
    blocks = {l: v4_block(w, l) for l in range(CFG.n_layers) if CFG.is_moe(l)}
    assert sorted(blocks) == [0, 2] and CFG.is_hash(0) and not CFG.is_hash(2)
    tok, clamped = 5, 0
    for pos in range(6):
        out = vm.step({"token": tok, "pos": pos})
        for l, blk in blocks.items():
            mid, gamma = vm.buffer(f"mid.{l}"), w[f"layers.{l}.ffn_norm"]
            h = gamma * mid * torch.rsqrt(mid.pow(2).mean() + CFG.norm_eps)
            with torch.no_grad():
                want = blk(h.view(1, 1, -1), input_ids=torch.tensor([[tok]])).view(-1)
                _, _, idx = blk.gate(h.view(1, 1, -1), torch.tensor([[tok]])) if CFG.is_hash(l) else blk.gate(h.view(1, 1, -1))
                gu = torch.nn.functional.linear(h, w[f"layers.{l}.experts_gate"][idx.view(-1)].reshape(-1, CFG.dim))
            clamped += int((gu > CFG.swiglu_limit).sum())
            got = vm.buffer(f"x.{l + 1}") - mid
            err = (got - want).abs().max() / want.abs().max()
            assert err <= TOL, f"{pos=} layer {l}: {err=:.2e}"
            ids = vm.buffer(f"expert_ids.{l}").long()
            assert sorted(ids.tolist()) == sorted(idx.view(-1).tolist()), f"{pos=} layer {l}"
        tok = int(out["next_token"][0])
    assert clamped > 0, "the clamp never bit: the test would not see it"


def test_hash_layer_ids_come_at_the_step_start():
    """A hash-routed layer's ids are written by a ROUTE task with no wait (the token's table row), and
    its expert tiles' loaders wait on that task alone, so they stream the experts as early as a dense
    layer's; the weights come from a second ROUTE after the logits."""
    from megavm.instructions import Op
    from megavm.schedule.lower import lower
    p = lower(CFG, ScheduleConfig(dtype="f32", capacity=16, n_sms=6))
    routes = {p.tasks[i].label: i for i in range(len(p.tasks)) if p.tasks[i].opcode == Op.ROUTE}
    assert set(routes) == {"L0.hash_ids", "L0.route", "L2.route"}
    hash_ids = p.tasks[routes["L0.hash_ids"]]
    assert hash_ids.waits == () and hash_ids.inputs[0] == -1 and hash_ids.outputs[1] == -1
    assert p.tasks[routes["L0.route"]].outputs[0] == -1
    writers, producers = p.writers(), p.producers()
    ids = p.buffer_id("expert_ids.0")
    for i, t in enumerate(p.tasks):
        if t.opcode in (Op.EXPERT_GLU, Op.EXPERT_DOWN) and t.label.startswith("L0."):
            k = p.index_wait(i, ids, writers, producers)
            assert k is not None and producers[t.waits[k].counter] == [routes["L0.hash_ids"]]
