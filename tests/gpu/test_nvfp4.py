"""E2M1 (NVFP4) weights (ScheduleConfig(weights="nvfp4")) on an NVIDIA GPU (marker: cuda): the
megakernel against ReferenceVM on the same tables, and against the eager model of the weights the
codes and scales stand for (schedule.weights.quantized_model(..., "nvfp4")), on rows of 1024, 2048 (the
held-activation GEMV, gemv_xreg), 8192 and 8224 codes (the last straddle 16 KiB ring stages), with direct
loads as well as the ring."""

import pytest
import torch

from megavm.schedule.eager import EagerDecoder
from megavm.schedule.models import ModelConfig
from megavm.schedule.weights import quantized_model, random_hf_weights
from megavm.vm.megakernel import MegakernelVM
from megavm.vm.reference import ReferenceVM
from megavm.vm.verify import VS_EAGER
from tests.gpu.harness import (QUANT_SHAPES, decodes_as_eager, matches_reference_and_direct_loads, quantized,
                               rel_err)

pytestmark = pytest.mark.cuda

SHAPES = {k: QUANT_SHAPES[k] for k in ("k1024", "k2048")} | {
    "odd": ModelConfig(dim=96, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=24, ffn_dim=8224, vocab=301),
}


def _nvfp4(cfg: ModelConfig, capacity: int = 64, seed: int = 5):
    return quantized(cfg, "nvfp4", capacity, seed)


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_nvfp4_matches_eager_of_its_dequantized_weights(shape):
    """Greedy tokens identical and logits within the bf16 tolerance (relative to the largest logit) of
    the eager model of what the codes and scales stand for, step after step."""
    cfg, hf, packed, w = _nvfp4(SHAPES[shape])
    decodes_as_eager(MegakernelVM(packed, w), cfg, hf, shape)


@pytest.mark.parametrize("shape", ["k1024", "k2048", "odd"])   # k2048: gemv_xreg's rows
def test_nvfp4_matches_reference_and_direct_loads(shape):
    """The same tables on ReferenceVM (code x block scale x row scale in torch), and direct loads bit
    for bit like the ring."""
    matches_reference_and_direct_loads(SHAPES[shape], "nvfp4", shape)


def test_nvfp4_is_neither_the_bf16_nor_the_fp8_model():
    """The checks above would not pass by accident: the bf16 weights' logits, and those of their fp8
    form, are far outside them."""
    cfg = SHAPES["k2048"]
    hf = random_hf_weights(cfg, torch.bfloat16, seed=5, device="cuda")
    cfg4, hf4, packed, w = _nvfp4(cfg)
    res = MegakernelVM(packed, w).run({"token": 11, "pos": 0})
    for name, (c, h) in {"bf16": (cfg, hf), "fp8": quantized_model(cfg, hf, "fp8")}.items():
        err = rel_err(res.logits, EagerDecoder(c, h, 64).step(11, 0))
        assert err > 10 * VS_EAGER["bf16"].value, f"nvfp4 logits within {err:.2e} of the {name} model's"


@pytest.mark.parametrize("name", ["llama-untied", "qwen3-qk-norm"])
def test_megavm_run_on_an_nvfp4_folder_matches_transformers(tmp_path, capsys, name):
    """`megavm run --checkpoint` on a `megavm quantize --format nvfp4` folder, on the GPU (the megakernel,
    checked by the command against eager and ReferenceVM), against transformers' model with the
    weights the folder stands for: tokens identical, logits within 1e-4 of the largest (f32)."""
    from tests.hf_families import check_fp8_run
    check_fp8_run(name, tmp_path, "cuda", capsys, "nvfp4")


def test_megavm_run_on_a_k2048_nvfp4_folder_takes_the_e4m3_tensor_cores_and_matches_transformers(tmp_path, capsys):
    """The same on llama-k2048 (hidden 2048, down K = 4096) over 16 queues: on the default build the down
    projection's tiles of 128 rows take the e4m3 tensor cores (MVM_E2M1_F8 = 96) and its K = 2048 rows
    gemv_xreg (tests/vm/test_sizing.py: test_tc_case_tiles_take_the_tensor_core_paths): tokens identical,
    logits within 1e-4 of the largest, against transformers."""
    from tests.hf_families import TC_SMS, check_fp8_run
    check_fp8_run("llama-k2048", tmp_path, "cuda", capsys, "nvfp4", sms=TC_SMS)


def test_tensor_core_e2m1_gemv_matches_eager_and_reference():
    """The research build MVM_E2M1_MMA=1 (tensor-core e2m1 GEMV where a tile is whole 16-row blocks of
    K a multiple of 2048; 63% of the k2048 shape's code bytes take it, the rest the row-per-warp
    path): greedy tokens of the eager model of the dequantized weights and logits within the bf16
    tolerance, step after step, and within 2e-3 of ReferenceVM on the same tables."""
    cfg, hf, packed, w = _nvfp4(SHAPES["k2048"])
    vm = MegakernelVM(packed, w, defines={"MVM_E2M1_MMA": 1})
    eager, ref = EagerDecoder(cfg, hf, 64), ReferenceVM(packed, w, device="cuda")
    tok = 11
    for pos in range(4):
        res = vm.run({"token": tok, "pos": pos})
        want, out = eager.step(tok, pos), ref.step({"token": tok, "pos": pos})
        assert rel_err(res.logits, want) <= VS_EAGER["bf16"].value, f"{pos=}: {rel_err(res.logits, want):.2e}"
        assert rel_err(res.logits, out["logits"]) <= 2e-3, f"{pos=}"
        assert res.token == int(want.argmax())
        tok = res.token



@pytest.mark.parametrize("shape", ["k1024", "k2048", "odd"])
def test_mxfp4_runs_as_eager_reference_and_direct_loads(shape):
    """mxfp4 weights (ScheduleConfig(weights="mxfp4"): e2m1 codes and an e8m0 exponent per 32, no row
    scales): greedy tokens and logits within the bf16 tolerance of the eager model of the mxfp4
    weights; ReferenceVM on the same tables, and direct loads bit for bit like the ring."""
    cfg, hf, packed, w = quantized(SHAPES[shape], "mxfp4")
    decodes_as_eager(MegakernelVM(packed, w), cfg, hf, f"{shape} mxfp4")
    matches_reference_and_direct_loads(SHAPES[shape], "mxfp4", f"{shape} mxfp4")


def test_mxfp4_exponents_across_the_whole_range_match_reference():
    """Blocks whose exponents lie 0 (2^-127, an f32 subnormal scale), 1 and 100 binades below 2^0 and
    60 above, in the same rows as ordinary ones: the megakernel against ReferenceVM on those tables
    (within 2e-3 of the largest logit, same tokens)."""
    _, _, packed, w = quantized(SHAPES["k1024"], "mxfp4")
    w = dict(w)
    for name in ("layers.0.w_down.block_scale", "layers.1.wq.block_scale", "lm_head.block_scale"):
        t = w[name].clone()
        t[5, :4] = torch.tensor([0, 1, 27, 187], dtype=torch.uint8)
        w[name] = t
    vm, ref = MegakernelVM(packed, w), ReferenceVM(packed, w, device="cuda")
    for pos, tok in enumerate([3, 8]):
        out, res = ref.step({"token": tok, "pos": pos}), vm.run({"token": tok, "pos": pos})
        assert rel_err(res.logits, out["logits"]) <= 2e-3 and res.token == int(out["next_token"][0])


def test_megavm_run_on_an_mxfp4_folder_matches_transformers(tmp_path, capsys):
    """`megavm run --checkpoint` on a `megavm quantize --format mxfp4` folder on the GPU, against
    transformers' model with the weights the folder stands for (1e-4 of the largest logit, f32)."""
    from tests.hf_families import check_fp8_run
    check_fp8_run("llama-untied", tmp_path, "cuda", capsys, "mxfp4")
