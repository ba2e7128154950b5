"""Shared setup for the GPU tests: compile a model for the device's SMs and make its weights."""
from __future__ import annotations

from dataclasses import replace

import torch

from megavm.schedule.config import ScheduleConfig
from megavm.schedule.models import ModelConfig
from megavm.schedule.weights import program_weights, random_hf_weights
from megavm.vm.compile import compile
from megavm.vm.pack import PackedProgram

TORCH_DT = {"f32": torch.float32, "bf16": torch.bfloat16}


def build(cfg: ModelConfig, sc: ScheduleConfig, seed: int = 0, n_sms: int | None = None):
    """-> (packed program, program weights on the GPU, Hugging Face weights on the GPU). n_sms: the SM
    queues, and what the tile sizes left at 0 are picked for (default: the device's SMs)."""
    n_sms = n_sms or torch.cuda.get_device_properties(0).multi_processor_count
    packed = compile(cfg, replace(sc, n_sms=n_sms))
    hf = random_hf_weights(cfg, TORCH_DT[sc.dtype], seed=seed, device="cuda")
    return packed, program_weights(cfg, hf), hf


def written(packed: PackedProgram) -> list[int]:
    """Every buffer some instruction writes (an empty optional output slot is none)."""
    return sorted({int(b) for r in packed.instrs for b in r["outputs"][:r["n_outputs"]] if b >= 0})


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """||a - b|| / ||b|| over the entries; equal entries (the -inf of an empty attention block) count 0."""
    a, b = a.double(), b.double()
    d = torch.where(a == b, torch.zeros_like(a), a - b)
    return (d.norm() / torch.where(torch.isfinite(b), b, 0).norm().clamp_min(1e-30)).item()


def quantized(cfg: ModelConfig, fmt: str, capacity: int = 64, seed: int = 5):
    """(cfg_q, hf_q, packed, weights) on the GPU: seeded random bf16 weights whose projections and LM
    head are stored in fmt ("fp8", "nvfp4" or "mxfp4"); hf_q is what those stand for (the oracle's weights)."""
    from megavm.schedule.weights import quantized_model, stored
    hf = random_hf_weights(cfg, torch.bfloat16, seed=seed, device="cuda")
    cfg_q, hf_q = quantized_model(cfg, hf, fmt)
    n_sms = torch.cuda.get_device_properties(0).multi_processor_count
    packed = compile(cfg_q, ScheduleConfig(dtype="bf16", weights=fmt, capacity=capacity, n_sms=n_sms))
    w = stored(program_weights(cfg_q, hf_q), [packed.buffer(i) for i in range(len(packed.buffers))], fmt)
    return cfg_q, hf_q, packed, w


def decodes_as_eager(vm, cfg: ModelConfig, hf: dict, label: str, steps: int = 6, capacity: int = 64) -> None:
    """Greedy tokens identical to the eager model's and logits within the bf16 tolerance (relative to
    the largest logit), step after step from token 11."""
    from megavm.schedule.eager import EagerDecoder
    from megavm.vm.verify import VS_EAGER
    eager, tok = EagerDecoder(cfg, hf, capacity), 11
    for pos in range(steps):
        res = vm.run({"token": tok, "pos": pos})
        ref = eager.step(tok, pos)
        err = rel_err(res.logits, ref)
        assert err <= VS_EAGER["bf16"].value, f"{label} {pos=}: {err=:.2e}"
        assert res.token == int(ref.argmax()), f"{label} {pos=}: token {res.token} against {int(ref.argmax())}"
        tok = res.token


# Shapes of the quantized-weight GPU tests: rows of K = 1024 and 2048 codes (q/k/v, gate/up), 4096 and
# 8192 (down), a tied head, GQA, tiles that do not divide the rows, and an expert stack.
QUANT_SHAPES = {
    "k1024": ModelConfig(dim=1024, n_layers=2, n_heads=8, n_kv_heads=2, head_dim=128, ffn_dim=4096, vocab=1000,
                         tied_embeddings=True),
    "k2048": ModelConfig(dim=2048, n_layers=2, n_heads=16, n_kv_heads=4, head_dim=128, ffn_dim=8192, vocab=2048),
    "experts": ModelConfig(dim=1024, n_layers=2, n_heads=8, n_kv_heads=2, head_dim=128, ffn_dim=4096, vocab=1000,
                           n_experts=8, top_k=2, expert_ffn=384),
}


def matches_reference_and_direct_loads(cfg: ModelConfig, fmt: str, label: str, knobs: dict | None = None) -> None:
    """The fmt tables on the megakernel against ReferenceVM on the same tables (within 2e-3 of the
    largest logit, same tokens), and the megakernel reading the weights straight from global memory
    computing the same bits as through the ring (both on the CUDA-core attention path, the
    direct-loads ablation's). With knobs (a build knob's path, e.g. MVM_U4_IMMA=1), both on that build,
    and logits that differ from the build with each of them 0 (so the path ran: its sums are in another
    order)."""
    from megavm.vm.megakernel import Ablations, MegakernelVM
    from megavm.vm.reference import ReferenceVM
    _, _, packed, w = quantized(cfg, fmt)
    cuda_cores = {"MVM_ATTN_MMA": 0}
    vm, ref = MegakernelVM(packed, w, defines=cuda_cores | (knobs or {})), ReferenceVM(packed, w, device="cuda")
    direct = MegakernelVM(packed, w, ablations=Ablations(direct_loads=True), defines=cuda_cores | (knobs or {}))
    base = MegakernelVM(packed, w, defines=cuda_cores | {k: 0 for k in knobs}) if knobs else None
    for pos, tok in enumerate([3, 8, 5]):
        out = ref.step({"token": tok, "pos": pos})
        res, res_d = vm.run({"token": tok, "pos": pos}), direct.run({"token": tok, "pos": pos})
        err = rel_err(res.logits, out["logits"])
        assert err <= 2e-3, f"{label} {pos=}: {err=:.2e}"
        assert res.token == int(out["next_token"][0])
        assert torch.equal(res.logits, res_d.logits), f"{label} {pos=}: direct loads differ"
        if base is not None:
            res_b = base.run({"token": tok, "pos": pos})
            assert not torch.equal(res.logits, res_b.logits), f"{label} {pos=}: the same bits as without {knobs}"


# The quantized caches' tensor-core shapes: head_dim 64 (the 1B's GQA group of 4) and 128 (a group of 8)
TENSOR_CORE_SHAPES = {
    "hd64": ModelConfig(dim=512, n_layers=2, n_heads=8, n_kv_heads=2, head_dim=64, ffn_dim=1024, vocab=512),
    "hd128": ModelConfig(dim=1024, n_layers=2, n_heads=8, n_kv_heads=1, head_dim=128, ffn_dim=2048, vocab=1000,
                         tied_embeddings=True),
}


def quantized_cache_setup(cfg: ModelConfig, kv_cache: str, ctx: int, steps: int, ablations=None):
    """A bf16 program of cfg with a quantized KV cache ("fp8" or "nvfp4") of one block per head, its
    megakernel, ReferenceVM and the eager model of that cache, all holding the same random history of
    ctx positions (flywheel/bench.py: fill_history): -> (megakernel, ReferenceVM, eager model)."""
    from megavm.flywheel.bench import fill_history
    from megavm.schedule.eager import EagerDecoder
    from megavm.vm.megakernel import Ablations, MegakernelVM
    from megavm.vm.reference import ReferenceVM
    cap = ctx + steps + 8
    packed, w, hf = build(cfg, ScheduleConfig(dtype="bf16", capacity=cap, kv_cache=kv_cache, kv_block=cap))
    vm = MegakernelVM(packed, w, ablations=ablations or Ablations())
    ref = ReferenceVM(packed, w, device="cuda")
    eager = EagerDecoder(cfg, hf, cap, kv_cache=kv_cache)
    fill_history(cfg, ctx, eager, [vm.buffer, ref.buffer], kv_cache=kv_cache)
    return vm, ref, eager


def tensor_cores_against_cuda_cores(cfg: ModelConfig, kv_cache: str, ctx: int, tol: float) -> float:
    """Three steps from ctx with the history through the ring (the tensor-core partial where the shape
    takes it), without the ring (attn_history=False: the CUDA-core partial) and with direct loads (no
    ring at all): the same greedy tokens, logits within tol (relative to the largest), and the last
    two bit for bit. Returns the first two's distance."""
    from megavm.vm.megakernel import Ablations
    logits, tokens = [], []
    for ab in (Ablations(), Ablations(attn_history=False), Ablations(direct_loads=True)):
        vm = quantized_cache_setup(cfg, kv_cache, ctx, 3, ab)[0]
        tok, lg, tk = 7, [], []
        for i in range(3):
            res = vm.run({"token": tok, "pos": ctx + i})
            lg.append(res.logits)
            tok = res.token
            tk.append(tok)
        logits.append(torch.stack(lg))
        tokens.append(tk)
    err = rel_err(logits[0], logits[1])
    assert tokens[0] == tokens[1] == tokens[2] and err <= tol, (tokens, err)
    assert torch.equal(logits[1], logits[2])
    return err
