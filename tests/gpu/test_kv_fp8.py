"""An fp8 KV cache (ScheduleConfig(kv_cache="fp8"): RMS_LINEAR_AMAX tiles -> KV_QUANT, e4m3 codes and a
scale per position, read by the attention partial as code x scale) on an NVIDIA GPU (marker: cuda):
the megakernel against ReferenceVM on the same tables and against the eager model of the quantized
cache (its rows quantized by vLLM's dynamic fp8 formula), over a random history that streams through
the ring in several stages."""

import pytest

from megavm.schedule.models import ModelConfig
from megavm.vm.verify import VS_EAGER
from tests.gpu.harness import TENSOR_CORE_SHAPES, quantized_cache_setup, rel_err, tensor_cores_against_cuda_cores

pytestmark = pytest.mark.cuda

# head_dim 64 and 128: the tensor-core partial; head_dim 48 (rows of 48 codes): the CUDA-core one. One KV
# block per head, so the history (ctx rows of 64 or 128 bytes) crosses 16 KiB ring stages.
SHAPES = TENSOR_CORE_SHAPES | {
    "hd48": ModelConfig(dim=192, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=48, ffn_dim=256, vocab=301),
}
CTX, STEPS = 600, 4


def _setup(shape: str):
    return (SHAPES[shape],) + quantized_cache_setup(SHAPES[shape], "fp8", CTX, STEPS)


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_fp8_cache_matches_reference_and_eager(shape):
    """Step after step from position CTX: tokens identical to ReferenceVM's and the eager model's, and
    logits within the bf16 tolerance (relative to the largest logit) of both. The new positions'
    scales agree with ReferenceVM's within 1e-3 (a later layer's rows carry the tensor-core partial's
    error: q and p in f16, 11 bits against the codes' 4), and at most 5% of their codes differ, each by
    at most two e4m3 steps plus that error (1e-3 of the row's amax: 0.45 in code units, many steps of
    a small code)."""
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
            s_vm, s_ref = vm.buffer(f"{which}_scale.{l}")[:, CTX:pos + 1], ref.buffer(f"{which}_scale.{l}")[:, CTX:pos + 1]
            assert ((s_vm - s_ref).abs() <= 1e-3 * s_ref.abs()).all(), (shape, which, l, (s_vm / s_ref - 1).abs().max())
            c_vm = vm.buffer(f"{which}_cache.{l}")[:, CTX:pos + 1].float()
            c_ref = ref.buffer(f"{which}_cache.{l}")[:, CTX:pos + 1].float()
            off = c_vm != c_ref
            print(f"{shape} L{l} {which}: scales {(s_vm / s_ref - 1).abs().max().item():.1e} apart, "
                  f"{off.float().mean().item():.2%} of codes")
            assert off.float().mean() <= 0.05, (shape, which, l, off.float().mean().item())
            step = (c_ref.abs() / 8).clamp_min(2 ** -9)        # an e4m3 step near the value (2^-9: subnormals)
            assert ((c_vm - c_ref).abs()[off] <= 2 * step[off] + 448e-3).all(), (shape, which, l)


def test_tensor_core_partial_matches_the_cuda_core_one():
    """hd64 and hd128 take the tensor-core partial (codes to f16, attn_mma_e4m3.cuh) when the history
    streams through the ring; without the ring (attn_history=False) the CUDA-core one. Same greedy
    tokens, logits within the bf16 tolerance; direct loads (no ring at all) give the CUDA-core
    logits bit for bit."""
    for shape in ("hd64", "hd128"):
        err = tensor_cores_against_cuda_cores(SHAPES[shape], "fp8", CTX, VS_EAGER["bf16"].value)
        print(f"{shape}: tensor cores against CUDA cores {err:.2e}")
