"""F8E4M3 weights with per-row scales (ScheduleConfig(weights="fp8")) on an NVIDIA GPU (marker: cuda):
the megakernel against ReferenceVM on the same tables, and against the eager model of the weights the
codes and scales stand for (schedule.weights.quantized_model), on shapes that take every GEMV path."""

import pytest
import torch

from megavm.schedule.eager import EagerDecoder
from megavm.schedule.models import ModelConfig
from megavm.schedule.weights import random_hf_weights
from megavm.vm.megakernel import MegakernelVM
from megavm.vm.reference import ReferenceVM
from megavm.vm.verify import VS_EAGER
from tests.gpu.harness import QUANT_SHAPES, decodes_as_eager, quantized, rel_err

pytestmark = pytest.mark.cuda

# e4m3 rows of K bytes: 80, 1024 and 2048 (part of a 4 KiB chunk: the row-per-warp path), 4096 and
# 8192 (whole chunks: the register path, 1 and 2 per row), 8208 (rows straddling 16 KiB ring stages);
# a tied head; GQA; tiles that do not divide the rows; an expert stack.
SHAPES = QUANT_SHAPES | {
    "odd": ModelConfig(dim=80, n_layers=2, n_heads=6, n_kv_heads=2, head_dim=24, ffn_dim=8208, vocab=301),
}


def _fp8(cfg: ModelConfig, capacity: int = 64, seed: int = 5):
    return quantized(cfg, "fp8", capacity, seed)


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_fp8_matches_eager_of_its_dequantized_weights(shape):
    """Greedy tokens identical and logits within the bf16 tolerance (relative to the largest logit) of
    the eager model of what the codes and scales stand for, step after step."""
    cfg, hf, packed, w = _fp8(SHAPES[shape])
    decodes_as_eager(MegakernelVM(packed, w), cfg, hf, shape)


@pytest.mark.parametrize("shape", ["k1024", "odd"])
def test_fp8_matches_reference(shape):
    """The same tables on ReferenceVM (which multiplies each code by its row's scale in torch)."""
    cfg, hf, packed, w = _fp8(SHAPES[shape])
    vm, ref = MegakernelVM(packed, w), ReferenceVM(packed, w, device="cuda")
    for pos, tok in enumerate([3, 8, 5]):
        out = ref.step({"token": tok, "pos": pos})
        res = vm.run({"token": tok, "pos": pos})
        err = rel_err(res.logits, out["logits"])
        assert err <= 2e-3, f"{shape} {pos=}: {err=:.2e}"
        assert res.token == int(out["next_token"][0])


def test_fp8_is_not_the_bf16_model():
    """The check above would not pass by accident: the bf16 weights' logits are far outside it."""
    cfg = SHAPES["k2048"]
    hf = random_hf_weights(cfg, torch.bfloat16, seed=5, device="cuda")
    cfg8, hf8, packed, w = _fp8(cfg)
    res = MegakernelVM(packed, w).run({"token": 11, "pos": 0})
    err = rel_err(res.logits, EagerDecoder(cfg, hf, 64).step(11, 0))
    assert err > 10 * VS_EAGER["bf16"].value, f"fp8 logits within {err:.2e} of the bf16 model's"


def test_megavm_run_on_an_fp8_folder_matches_transformers(tmp_path, capsys):
    """`megavm run --checkpoint` on a `megavm quantize --format fp8` folder, on the GPU (the megakernel,
    checked by the command against eager and ReferenceVM), against transformers' model with the
    weights the folder stands for: tokens identical, logits within 1e-4 of the largest (f32)."""
    from tests.hf_families import check_fp8_run
    check_fp8_run("llama-untied", tmp_path, "cuda", capsys)
