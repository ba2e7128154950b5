"""xs and the ring sized to the program (vm/sizing.py) on an NVIDIA GPU (marker: cuda): the sized build
computes what the default build (the whole MAX_K, 10 stages) does, bit for bit, over five greedy steps,
in each tier and with packed weights."""
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


def _same_steps(name, packed, w, stages):
    sized, full = MegakernelVM(packed, w), MegakernelVM(packed, w, defines=FULL)
    assert sized.defines.get("MVM_STAGES", STAGES) == stages, sized.defines
    assert full.defines == FULL
    tok = 7
    for pos in range(5):
        a = full.run({"token": tok, "pos": pos}).outputs()
        b = sized.run({"token": tok, "pos": pos}).outputs()
        for k in a:
            assert torch.equal(a[k], b[k]), f"{name} {pos=} {k} differs"
        tok = int(a["next_token"][0])
