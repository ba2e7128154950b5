"""Mixture-of-experts decode on the GPU: the router, the late-bound expert streams and the weighted
expert sum of the megakernel against ReferenceVM (marker: cuda)."""
import math
from dataclasses import replace

import pytest
import torch

from megavm.core.types import BufferKind, DType
from megavm.schedule.config import ScheduleConfig
from megavm.schedule.models import ModelConfig
from megavm.vm.compile import compile
from megavm.vm.megakernel import Ablations, MegakernelVM
from megavm.vm.reference import ReferenceVM
from tests.gpu.harness import rel_err, written

pytestmark = pytest.mark.cuda

TOL = {"f32": 1e-4, "bf16": 2e-3}       # relative L2 error of each written f32 buffer against ReferenceVM
# experts of rows straddling ring stages (K = 200 bf16 = 400 bytes), a dense layer, 16 experts choose 4
MOE = ModelConfig(dim=256, n_layers=3, n_heads=4, n_kv_heads=2, head_dim=64, ffn_dim=384, vocab=1000,
                  family="qwen3_moe", qk_norm=True, n_experts=16, top_k=4, expert_ffn=200, router_renorm=False,
                  dense_layers=(1,))
MIXTRAL = ModelConfig(dim=2048, n_layers=2, n_heads=16, n_kv_heads=4, head_dim=128, ffn_dim=2048, vocab=1000,
                      family="mixtral", n_experts=8, top_k=2, expert_ffn=2048)


def random_weights(packed, seed: int = 0) -> dict[str, torch.Tensor]:
    """Every weight buffer drawn on the GPU: matrices (and expert stacks) scaled by 1/sqrt(K), norms near 1."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    out = {}
    for i, r in enumerate(packed.buffers):
        if r["kind"] != BufferKind.WEIGHT:
            continue
        shape = packed.shape(i)
        t = torch.randn(shape, generator=g, device="cuda")
        t = t / math.sqrt(shape[-1]) if len(shape) >= 2 else 1.0 + 0.1 * t
        out[packed.names[i]] = t.to(DType(int(r["dtype"])).torch)
    n = out["rope_freqs"].numel()
    out["rope_freqs"] = 10000.0 ** (-torch.arange(n, device="cuda") / n)
    return out


def _check(cfg, sc, n_sms, ablations=Ablations(), steps=range(0, 40, 3)):
    packed = compile(cfg, replace(sc, n_sms=n_sms))
    w = random_weights(packed, seed=5)
    gpu, ref = MegakernelVM(packed, w, ablations=ablations), ReferenceVM(packed, w, device="cuda")
    tok, chosen = 7, set()
    for pos in steps:
        res = gpu.run({"token": tok, "pos": pos})
        out = ref.step({"token": tok, "pos": pos})
        for b in written(packed):
            name = packed.names[b]
            if name.startswith("expert_ids"):
                assert torch.equal(gpu.t[b], ref.t[b]), f"{pos=} {name}: {gpu.t[b].tolist()} != {ref.t[b].tolist()}"
                chosen.add(tuple(gpu.t[b].tolist()))
            elif gpu.t[b].is_floating_point():
                err = rel_err(gpu.t[b], ref.t[b])
                assert err <= TOL[sc.dtype], f"{pos=} buffer {name}: {err=:.2e}"
        assert res.token == int(out["next_token"][0]), f"{pos=}"
        tok = res.token
    assert len(chosen) > 3, f"the router chose the same experts every step: {chosen}"


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize("n_sms", [5, 0])
def test_moe_every_written_buffer_matches_reference(dtype, n_sms):
    """ROUTE, EXPERT_GLU and EXPERT_DOWN (and a dense layer between MoE layers): every buffer after
    each of several steps, ids exact, against ReferenceVM; on 5 SMs (long queues, each loader waiting
    on a router while its block still works) and on every SM."""
    n = n_sms or torch.cuda.get_device_properties(0).multi_processor_count
    _check(MOE, ScheduleConfig(dtype=dtype, capacity=64), n)


def test_moe_direct_loads_and_mixtral_shape():
    """The direct-loads ablation reads the chosen experts itself (no loader); a Mixtral-shaped layer
    (8 experts, top 2, rows of whole 4 KiB chunks: the register GEMV path)."""
    n = torch.cuda.get_device_properties(0).multi_processor_count
    _check(MOE, ScheduleConfig(dtype="bf16", capacity=64), n, Ablations(direct_loads=True), steps=range(0, 12, 3))
    _check(MIXTRAL, ScheduleConfig(dtype="bf16", capacity=64), n)


def test_moe_token_loop_matches_host_loop():
    """generate() with the in-kernel token loop picks the same tokens as one launch per token."""
    n = torch.cuda.get_device_properties(0).multi_processor_count
    packed = compile(MOE, ScheduleConfig(dtype="bf16", capacity=64, n_sms=n))
    w = random_weights(packed, seed=9)
    loop = MegakernelVM(packed, w).generate([3, 14, 15], 20)
    host = MegakernelVM(packed, w, ablations=Ablations(host_loop=True)).generate([3, 14, 15], 20)
    assert loop == host
