"""fp8-block weights (ScheduleConfig(weights="fp8-block"): e4m3 codes, an f32 scale per 128 x 128 block)
on an NVIDIA GPU (marker: cuda): the megakernel against the eager model of the weights the codes and
scales stand for and against ReferenceVM on the same tables, on rows of 1024, 2048, 4096 and 8208 codes
(the last straddle 16 KiB ring stages) in tiles that straddle 128-row blocks, partial blocks of rows
and columns, an expert stack, direct loads bit for bit like the ring, and `megavm run` on a folder in
the Hugging Face "fp8" layout against transformers."""

import pytest
import torch

from megavm.schedule.eager import EagerDecoder
from megavm.schedule.models import ModelConfig
from megavm.schedule.weights import quantized_model, random_hf_weights
from megavm.vm.megakernel import MegakernelVM
from megavm.vm.verify import VS_EAGER
from tests.gpu.harness import (QUANT_SHAPES, decodes_as_eager, matches_reference_and_direct_loads, quantized,
                               rel_err)

pytestmark = pytest.mark.cuda

SHAPES = QUANT_SHAPES | {
    "odd": ModelConfig(dim=208, n_layers=2, n_heads=6, n_kv_heads=2, head_dim=32, ffn_dim=8208, vocab=301),
}


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_fp8_block_matches_eager_of_its_dequantized_weights(shape):
    """Greedy tokens identical and logits within the bf16 tolerance (relative to the largest logit) of
    the eager model of what the codes and block scales stand for, step after step."""
    cfg, hf, packed, w = quantized(SHAPES[shape], "fp8-block")
    decodes_as_eager(MegakernelVM(packed, w), cfg, hf, shape)


@pytest.mark.parametrize("shape", ["k2048", "odd"])
def test_fp8_block_matches_reference_and_direct_loads(shape):
    """The same tables on ReferenceVM (code x block scale in torch), and direct loads bit for bit like
    the ring."""
    matches_reference_and_direct_loads(SHAPES[shape], "fp8-block", shape)


def test_fp8_block_is_not_the_per_row_fp8_model():
    """The checks above would not pass by accident: the logits of the same weights in per-row fp8 (and
    in bf16) are far outside them."""
    cfg = SHAPES["k2048"]
    hf = random_hf_weights(cfg, torch.bfloat16, seed=5, device="cuda")
    _, _, packed, w = quantized(cfg, "fp8-block")
    res = MegakernelVM(packed, w).run({"token": 11, "pos": 0})
    for name, (c, h) in {"bf16": (cfg, hf), "fp8": quantized_model(cfg, hf, "fp8")}.items():
        err = rel_err(res.logits, EagerDecoder(c, h, 64).step(11, 0))
        assert err > 10 * VS_EAGER["bf16"].value, f"fp8-block logits within {err:.2e} of the {name} model's"


def test_megavm_run_on_an_fp8_block_folder_matches_transformers(tmp_path, capsys):
    """`megavm run --checkpoint` on a `megavm quantize --format fp8-block` folder, on the GPU, against
    transformers' model with the weights the folder stands for: tokens identical, logits within 1e-4
    of the largest (f32)."""
    from tests.hf_families import check_fp8_run
    check_fp8_run("qwen3-qk-norm", tmp_path, "cuda", capsys, "fp8-block")
