"""xs and the ring sized to the program (vm/sizing.py) on an NVIDIA GPU (marker: cuda): the sized build
computes what the default build (the whole MAX_K, 10 stages) does, bit for bit, over five steps, in each
tier, with packed weights, quantized KV caches, experts and routers, LoRA adapters and sampling, and
for DLRM."""
import pytest
import torch

from megavm.schedule.config import ScheduleConfig
from megavm.schedule.models import PRESETS, ModelConfig
from megavm.vm.megakernel import MegakernelVM
from megavm.core.limits import STAGES
from tests.gpu.harness import build, quantized

pytestmark = pytest.mark.cuda

FULL = {"MEGAVM_MAX_K": 16384}                      # the default build (vm/sizing.py: a caller's knob wins)
# one shape a tier on a 132-SM GPU (vm/sizing.py: TIERS): small (its LM head's tiles: 2976 floats, 13
# stages), a llama-1b-like FFN whose down tiles' x and row sums fill 8224 of the 8380 floats beside 12
# stages, a wider FFN (9216: the row-per-warp path) at 11, and an odd Qwen3-like one (head_dim 128, head
# norms by finishing tasks) at 13
SHAPES = {
    "small": (PRESETS["small"], dict(capacity=64), 13),
    "llama-1b-k": (ModelConfig(dim=512, n_layers=2, n_heads=8, n_kv_heads=2, head_dim=64, ffn_dim=8192, vocab=1000),
                   dict(capacity=256, kv_block=64, attn_direct=False), 12),
    "wide-k": (ModelConfig(dim=512, n_layers=2, n_heads=8, n_kv_heads=2, head_dim=64, ffn_dim=9216, vocab=1000),
               dict(capacity=128), 11),
    "odd": (ModelConfig(dim=384, n_layers=2, n_heads=6, n_kv_heads=2, head_dim=128, ffn_dim=1000, vocab=777,
                        qk_norm=True, family="qwen3"), dict(capacity=96), 13),
}


@pytest.mark.parametrize("name", sorted(SHAPES))
def test_sized_build_bit_identical(name):
    cfg, sched, stages = SHAPES[name]
    packed, w, _ = build(cfg, ScheduleConfig(dtype="bf16", **sched), seed=3)
    _same_steps(name, packed, w, stages)


@pytest.mark.parametrize("weights", ["fp8", "nvfp4", "mxfp4", "int4"])
@pytest.mark.parametrize("name", ["small", "llama-1b-k"])
def test_sized_build_bit_identical_packed_weights(name, weights):
    cfg, sched, stages = SHAPES[name]
    _, _, packed, w = quantized(cfg, weights, capacity=sched["capacity"])
    _same_steps(f"{name} {weights}", packed, w, stages)


@pytest.mark.parametrize("kv_cache", ["fp8", "nvfp4"])
@pytest.mark.parametrize("name", ["small", "llama-1b-k"])
def test_sized_build_bit_identical_kv_cache(name, kv_cache):
    """the quantized append (RMS_LINEAR_AMAX then KV_QUANT) and the quantized partials, their scales
    staged above the scores: small takes 13 stages with e4m3 and 12 with NVFP4 (4564 floats)"""
    cfg, sched, stages = SHAPES[name]
    packed, w, _ = build(cfg, ScheduleConfig(dtype="bf16", **sched, kv_cache=kv_cache), seed=3)
    _same_steps(f"{name} {kv_cache}", packed, w, 12 if kv_cache == "nvfp4" else stages)


def test_sized_build_bit_identical_sampling():
    """SAMPLE: its f64 sums and the LM-head tiles' maxima in xs, top-k, top-p and every-token draws"""
    from megavm.vm.compile import compile
    from tests.gpu.test_moe import random_weights
    n_sms = torch.cuda.get_device_properties(0).multi_processor_count
    packed = compile(PRESETS["small"], ScheduleConfig(dtype="bf16", capacity=64, n_sms=n_sms, sample=True))
    draws = [torch.tensor(s) for s in ([0.8, 8.0, 1.0], [1.0, 0.0, 1.0], [1.2, 20.0, 0.9], [0.0, 0.0, 1.0],
                                       [2.0, 32.0, 0.5])]
    _same_steps("sampling", packed, random_weights(packed, seed=4), 13,
                extra=lambda pos: {"sampling": draws[pos], "seed": 11})


@pytest.mark.parametrize("batch", [1, 7])
def test_sized_build_bit_identical_dlrm(batch):
    """DLRM: the gathers, the interaction's vectors in xs, the MLPs' batched GEMVs"""
    from megavm.schedule.dlrm import PRESETS as DLRM, DLRMSchedule, pad_dense, program_weights
    from megavm.vm.compile import compile
    from tests.schedule.test_dlrm import _inputs, _state
    cfg = DLRM["dlrm-tiny"]
    n_sms = torch.cuda.get_device_properties(0).multi_processor_count
    packed = compile(cfg, DLRMSchedule(batch=batch, dtype="bf16", n_sms=n_sms))
    w = program_weights(cfg, {k: v.to(torch.bfloat16).float().cuda() for k, v in _state(cfg, 1).items()}, "bf16")
    sized, full = _pair(packed, w, 13)
    for s in range(3):
        dense, sparse = _inputs(cfg, batch, seed=batch + s)
        inputs = {"dense": pad_dense(cfg, dense), "sparse": sparse}
        a, b = full.run(inputs).outputs(), sized.run(inputs).outputs()
        assert all(torch.equal(a[k], b[k]) for k in a), f"dlrm {batch=} step {s} differs"


@pytest.mark.parametrize("name,stages", [("moe", 13), ("v4", 13), ("mixtral", 12)])
def test_sized_build_bit_identical_experts(name, stages):
    """routers (V4's hash layer on the general path), expert tiles (Mixtral's rows on the register path),
    a shared expert"""
    from megavm.vm.compile import compile
    from tests.gpu.test_moe import MIXTRAL, MOE, V4, random_weights
    cfg = {"moe": MOE, "v4": V4, "mixtral": MIXTRAL}[name]
    n_sms = torch.cuda.get_device_properties(0).multi_processor_count
    packed = compile(cfg, ScheduleConfig(dtype="bf16", capacity=64, n_sms=n_sms))
    _same_steps(name, packed, random_weights(packed, seed=5), stages)


@pytest.mark.parametrize("lora_a_tasks,stages", [(True, 11), (False, 12)])
def test_sized_build_bit_identical_lora(lora_a_tasks, stages):
    """LoRA on every projection of the odd shape (K = 8200 down rows): LORA_A tasks whose rows of A fill
    12300 of 12480 floats, or A in the producing tasks; B's rows staged by the consumers; ids 0 to 3"""
    from dataclasses import replace

    from megavm.schedule.lora_layout import LoraLayout, lora_weights
    from tests.gpu.test_lora import ADAPTERS, ALL
    from tests.gpu.test_megakernel import ODD, ODD_LC
    sc = ScheduleConfig(dtype="bf16", **ODD_LC, lora_adapters=len(ADAPTERS), lora_rank=8, lora_targets=ALL,
                        lora_a_tasks=lora_a_tasks)
    packed, w, _ = build(ODD, sc, seed=3)
    w |= lora_weights(LoraLayout.of(ODD, replace(sc, n_sms=packed.n_queues)), ADAPTERS, w)
    _same_steps(f"lora {lora_a_tasks=}", packed, w, stages, adapters=True)


def _pair(packed, w, stages):
    """the program on the build sized to it and on the default build (MVM_KV_E2M1 beside both where the
    program holds an NVFP4 cache)"""
    sized, full = MegakernelVM(packed, w), MegakernelVM(packed, w, defines=FULL)
    assert sized.defines.get("MVM_STAGES", STAGES) == stages, sized.defines
    assert full.defines.get("MEGAVM_MAX_K") == FULL["MEGAVM_MAX_K"] and "MVM_STAGES" not in full.defines
    return sized, full


def _same_steps(name, packed, w, stages, adapters=False, extra=None):
    sized, full = _pair(packed, w, stages)
    tok = 7
    for pos in range(5):
        inputs = {"token": tok, "pos": pos} | ({"adapter": pos % 4} if adapters else {}) | (extra(pos) if extra else {})
        a = full.run(inputs).outputs()
        b = sized.run(inputs).outputs()
        for k in a:
            assert torch.equal(a[k], b[k]), f"{name} {pos=} {k} differs"
        tok = int(a["next_token"][0])
