"""int4 (AWQ) weights (ScheduleConfig(weights="int4")) on an NVIDIA GPU (marker: cuda): the megakernel
against ReferenceVM on the same tables, and against the eager model of the weights the codes, zero
points and scales stand for (schedule.weights.quantized_model(..., "int4")), on rows of 1024, 2048,
4096 and 8320 codes (the last straddle 16 KiB ring stages), an expert stack, with direct loads as well
as the ring, and
`megavm run` on an AWQ folder against transformers."""

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
    "odd": ModelConfig(dim=128, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=32, ffn_dim=8320, vocab=304),
    # expert stacks of K = 2048 rows: EXPERT_GLU on the held-activation GEMV (gemv_xreg)
    "experts2048": ModelConfig(dim=2048, n_layers=2, n_heads=16, n_kv_heads=4, head_dim=128, ffn_dim=4096, vocab=1000,
                               n_experts=8, top_k=2, expert_ffn=384),
}


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_int4_matches_eager_of_its_dequantized_weights(shape):
    """Greedy tokens identical and logits within the bf16 tolerance (relative to the largest logit) of
    the eager model of what the codes, zero points and scales stand for, step after step."""
    cfg, hf, packed, w = quantized(SHAPES[shape], "int4")
    decodes_as_eager(MegakernelVM(packed, w), cfg, hf, shape)


# gemv_xreg's rows: k1024's down projection (K = 4096), k2048's K = 2048, experts2048's expert stacks
@pytest.mark.parametrize("shape", ["k1024", "k2048", "experts2048", "odd"])
def test_int4_matches_reference_and_direct_loads(shape):
    """The same tables on ReferenceVM ((code - zero) x scale in torch), and direct loads bit for bit
    like the ring."""
    matches_reference_and_direct_loads(SHAPES[shape], "int4", shape)


def test_int4_is_neither_the_bf16_nor_the_nvfp4_model():
    """The checks above would not pass by accident: the bf16 weights' logits, and those of their nvfp4
    form, are far outside them."""
    cfg = SHAPES["k2048"]
    hf = random_hf_weights(cfg, torch.bfloat16, seed=5, device="cuda")
    _, _, packed, w = quantized(cfg, "int4")
    res = MegakernelVM(packed, w).run({"token": 11, "pos": 0})
    for name, (c, h) in {"bf16": (cfg, hf), "nvfp4": quantized_model(cfg, hf, "nvfp4")}.items():
        err = rel_err(res.logits, EagerDecoder(c, h, 64).step(11, 0))
        assert err > 10 * VS_EAGER["bf16"].value, f"int4 logits within {err:.2e} of the {name} model's"


@pytest.mark.parametrize("name", ["llama-int4", "qwen3-int4"])
def test_megavm_run_on_an_int4_folder_matches_transformers(tmp_path, capsys, name):
    """`megavm run --checkpoint` on a `megavm quantize --format int4` folder, on the GPU (the megakernel,
    checked by the command against eager and ReferenceVM), against transformers' model with the
    weights the folder stands for: tokens identical, logits within 1e-4 of the largest (f32)."""
    from tests.hf_families import check_fp8_run
    check_fp8_run(name, tmp_path, "cuda", capsys, "int4")


def test_megavm_run_on_a_k2048_int4_folder_takes_the_integer_tensor_cores_and_matches_transformers(tmp_path, capsys):
    """The same on llama-k2048 (hidden 2048, down K = 4096) over 16 queues: every projection's tiles have 128
    rows or more, so on the default build all of them take the integer tensor cores (MVM_U4_IMMA = 32;
    tests/vm/test_sizing.py: test_tc_case_tiles_take_the_tensor_core_paths): tokens identical, logits within
    1e-4 of the largest, against transformers."""
    from tests.hf_families import TC_SMS, check_fp8_run
    check_fp8_run("llama-k2048", tmp_path, "cuda", capsys, "int4", sms=TC_SMS)


def test_megavm_run_on_a_k2048_f8192_int4_folder_takes_b_in_x_place_and_matches_transformers(tmp_path, capsys):
    """The same on llama-k2048-f8192 (down K = 8192) over 32 queues: its down projection's tiles (64 rows) take
    the integer tensor cores with B in x's place (MVM_U4_IMMA_LONG = 32), the other tiles the path above
    (tests/vm/test_sizing.py holds that): tokens identical, logits within 1e-4 of the largest, against
    transformers."""
    from tests.hf_families import TC_LONG_SMS, check_fp8_run
    check_fp8_run("llama-k2048-f8192", tmp_path, "cuda", capsys, "int4", sms=TC_LONG_SMS)
