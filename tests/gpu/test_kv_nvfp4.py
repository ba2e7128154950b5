"""An NVFP4 KV cache (ScheduleConfig(kv_cache="nvfp4"): RMS_LINEAR_AMAX tiles -> KV_QUANT, e2m1 codes, an
e4m3 scale per 16 elements and an f32 scale per position, read by the attention partial as code x block
scale x scale) on an NVIDIA GPU (marker: cuda): the megakernel against ReferenceVM on the same tables
and against the eager model of the quantized cache, over a random history that streams through the
ring in several stages; the kernel's quantizer bit for bit against vLLM's formula (core/codecs.py) on
the rows the kernel itself produced."""

import pytest
import torch

from megavm.core.codecs import e2m1_values, nvfp4_rows
from megavm.schedule.models import ModelConfig
from megavm.vm.verify import VS_EAGER
from tests.gpu.harness import TENSOR_CORE_SHAPES, quantized_cache_setup, rel_err, tensor_cores_against_cuda_cores

pytestmark = pytest.mark.cuda

# head_dim 64 and 128: the tensor-core partial (attn_mma_e2m1.cuh); head_dim 96 (rows of 48 bytes): the
# CUDA-core one. One KV block per head, so the history (rows of 32 or 64 bytes) crosses 16 KiB ring stages.
SHAPES = TENSOR_CORE_SHAPES | {
    "hd96": ModelConfig(dim=384, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=96, ffn_dim=256, vocab=301),
}
CTX, STEPS = 1100, 4


def _setup(shape: str):
    return (SHAPES[shape],) + quantized_cache_setup(SHAPES[shape], "nvfp4", CTX, STEPS)


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_nvfp4_cache_matches_reference_and_eager(shape):
    """Step after step from position CTX: tokens identical to ReferenceVM's and the eager model's, and
    logits within the bf16 tolerance (relative to the largest logit) of both. The kernel's KV_QUANT,
    given the rows its own tiles produced (k_new / v_new), writes exactly the codes, block scales and
    scale of vLLM's formula on them; against ReferenceVM's rows (whose GEMV sums in another order) the
    scales agree within 1e-3 and at most 10% of the codes differ, each to a neighbouring grid value
    (2 at most, the step between 4 and 6)."""
    cfg, vm, ref, eager = _setup(shape)
    tok, tol = 7, VS_EAGER["bf16"].value
    for pos in range(CTX, CTX + STEPS):
        got, want = vm.run({"token": tok, "pos": pos}), ref.step({"token": tok, "pos": pos})
        oracle = eager.step(tok, pos)
        e_ref, e_eager = rel_err(got.logits, want["logits"]), rel_err(got.logits, oracle)
        print(f"{shape} {pos=}: vs reference {e_ref:.2e}, vs eager {e_eager:.2e}")
        assert e_ref <= tol and e_eager <= tol, (shape, pos, e_ref, e_eager)
        assert got.token == int(want["next_token"][0]) == int(oracle.argmax()), (shape, pos)
        tok = got.token
        for l in range(cfg.n_layers):
            for which in ("k", "v"):
                rows = vm.buffer(f"{which}_new.{l}").view(cfg.n_kv_heads, cfg.head_dim)
                codes, bscale, scale = nvfp4_rows(rows, rows.abs().max())
                assert torch.equal(vm.buffer(f"{which}_cache.{l}")[:, pos], codes), (shape, pos, which, l)
                assert torch.equal(vm.buffer(f"{which}_bscale.{l}")[:, pos].view(torch.uint8),
                                   bscale.view(torch.uint8)), (shape, pos, which, l)
                assert (vm.buffer(f"{which}_scale.{l}")[:, pos] == scale).all(), (shape, pos, which, l)
    for l in range(cfg.n_layers):
        for which in ("k", "v"):
            s_vm, s_ref = vm.buffer(f"{which}_scale.{l}")[:, CTX:pos + 1], ref.buffer(f"{which}_scale.{l}")[:, CTX:pos + 1]
            assert ((s_vm - s_ref).abs() <= 1e-3 * s_ref.abs()).all(), (shape, which, l, (s_vm / s_ref - 1).abs().max())
            c_vm, c_ref = vm.buffer(f"{which}_cache.{l}")[:, CTX:pos + 1], ref.buffer(f"{which}_cache.{l}")[:, CTX:pos + 1]
            nib = lambda c: torch.stack([c & 15, c >> 4], -1).flatten(-2).int()
            off = nib(c_vm) != nib(c_ref)
            print(f"{shape} L{l} {which}: scales {(s_vm / s_ref - 1).abs().max().item():.1e} apart, "
                  f"{off.float().mean().item():.2%} of codes")
            assert off.float().mean() <= 0.10, (shape, which, l, off.float().mean().item())
            dv = (e2m1_values(nib(c_vm)) - e2m1_values(nib(c_ref))).abs()      # neighbouring grid values
            assert (dv[off] <= 2).all(), (shape, which, l, dv.max().item())


def test_tensor_core_partial_matches_the_cuda_core_one():
    """hd64 and hd128 take the tensor-core partial (codes to f16 times their block scales,
    attn_mma_e2m1.cuh) when the history streams through the ring; without the ring (attn_history=False)
    the CUDA-core one. Same greedy tokens, logits within the bf16 tolerance; direct loads (no ring at
    all) give the CUDA-core logits bit for bit."""
    for shape in ("hd64", "hd128"):
        err = tensor_cores_against_cuda_cores(SHAPES[shape], "nvfp4", CTX, VS_EAGER["bf16"].value)
        print(f"{shape}: tensor cores against CUDA cores {err:.2e}")


@pytest.mark.parametrize("kv_cache", ["fp8", "nvfp4"])
def test_decode_from_position_zero_follows_codes_at_near_ties(kv_cache):
    """A greedy decode from position 0 (every row of the cache the kernel's own, the new row a large
    part of each step's keys) against the eager model stepped beside it, which follows the kernel's
    stored codes wherever they are a valid rounding of its own rows (vm/verify.py: FollowKVCodes):
    tokens identical, logits within the bf16 tolerance, no row that is not such a rounding. Without the
    following, `megavm run --model small --kv-cache nvfp4` lost the oracle's tokens at the second one
    (H100, a093c05)."""
    from megavm.schedule.config import ScheduleConfig
    from megavm.schedule.eager import EagerDecoder
    from megavm.vm.megakernel import MegakernelVM
    from megavm.vm.verify import FollowKVCodes
    from tests.gpu.harness import build
    cfg = SHAPES["hd64"]
    packed, w, hf = build(cfg, ScheduleConfig(dtype="bf16", capacity=64, kv_cache=kv_cache))
    vm = MegakernelVM(packed, w)
    eager = EagerDecoder(cfg, hf, 64, kv_cache=kv_cache)
    eager.kv_follow = follow = FollowKVCodes(vm)
    tok = 3
    for pos in range(16):
        got = vm.run({"token": tok, "pos": pos})
        want = eager.step(tok, pos)
        err = rel_err(got.logits, want)
        assert got.token == int(want.argmax()) and err <= VS_EAGER["bf16"].value, (kv_cache, pos, err)
        tok = got.token
    print(f"{kv_cache}: {follow.followed} rows followed")
    assert follow.errors == 0, follow.errors
