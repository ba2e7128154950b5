"""xs and the ring sized to the program (vm/sizing.py) on an NVIDIA GPU (marker: cuda): the sized build
computes what the default build (the whole MAX_K, 10 stages) does, bit for bit, over five greedy steps,
in each tier, with packed weights, experts and routers, and LoRA adapters."""
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


def _same_steps(name, packed, w, stages, adapters=False):
    sized, full = MegakernelVM(packed, w), MegakernelVM(packed, w, defines=FULL)
    assert sized.defines.get("MVM_STAGES", STAGES) == stages, sized.defines
    assert full.defines == FULL
    tok = 7
    for pos in range(5):
        inputs = {"token": tok, "pos": pos} | ({"adapter": pos % 4} if adapters else {})
        a = full.run(inputs).outputs()
        b = sized.run(inputs).outputs()
        for k in a:
            assert torch.equal(a[k], b[k]), f"{name} {pos=} {k} differs"
        tok = int(a["next_token"][0])
