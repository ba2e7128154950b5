"""E2M1 (NVFP4) projection weights (ScheduleConfig(weights="nvfp4")): e2m1 codes two to a byte, an e4m3
scale per 16 codes and the matrix's f32 global scale on every row, streamed by the GEMV and dequantized
in registers. On the CPU: the program is valid, ReferenceVM computes the model the codes and scales
stand for (test_fp8_weights.py, parametrized over both formats), the stored tensors are
exactly the nvfp4 format's (schedule/quant.py, held to vLLM's reference quantizer in test_quant.py),
and bad tables or weights are refused naming the buffer."""
from dataclasses import replace

import pytest
import torch
from megavm.core.errors import UserError
from megavm.core.types import Buffer, BufferKind, DType
from megavm.schedule import quant
from megavm.schedule.assign import assign
from megavm.schedule.config import ScheduleConfig
from megavm.schedule.lower import lower
from megavm.schedule.models import ModelConfig
from megavm.schedule.validate import validate
from megavm.schedule.weights import e2m1_weight, stored
from megavm.vm.pack import pack
from megavm.vm.reference import ReferenceVM

from tests.programs import changed, quantized_program, refusals

CFG = ModelConfig(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16, ffn_dim=96, vocab=200,
                  tied_embeddings=True)
PROJ = ("wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down")


def _program(cfg=CFG, dtype="f32", n_sms=4, seed=1):
    return quantized_program(cfg, "nvfp4", dtype, n_sms, seed)


def test_projections_and_head_are_e2m1_with_block_and_row_scales():
    _, _, _, _, p, w = _program()
    e2m1 = {b.name for b in p.buffers if b.dtype == DType.E2M1}
    assert e2m1 == {"lm_head"} | {f"layers.{l}.{n}" for l in range(2) for n in PROJ}
    for n in e2m1:
        shape = p.buffers[p.buffer_id(n)].shape
        s, bs = p.buffers[p.buffer_id(n + ".scale")], p.buffers[p.buffer_id(n + ".block_scale")]
        assert (s.kind, s.dtype, s.shape) == (BufferKind.WEIGHT, DType.F32, shape[:-1])
        assert (bs.kind, bs.dtype, bs.shape) == (BufferKind.WEIGHT, DType.F8E4M3, (*shape[:-1], shape[-1] // 16))
        assert w[n].dtype == torch.uint8 and tuple(w[n].shape) == (*shape[:-1], shape[-1] // 2)
        assert w[n + ".block_scale"].dtype == torch.float8_e4m3fn and w[n + ".scale"].dtype == torch.float32
        assert p.buffers[p.buffer_id(n)].nbytes == w[n].numel()
    assert validate(p, assign(p, 4)).ok
    packed = pack(p, assign(p, 4))
    i = p.buffer_id("layers.0.wq")
    assert int(packed.buffers[i]["scale"]) == p.buffer_id("layers.0.wq.scale")
    assert int(packed.buffers[i]["block_scale"]) == p.buffer_id("layers.0.wq.block_scale")
    assert int(packed.buffers[p.buffer_id("layers.0.wq.block_scale")]["block_scale"]) == -1


def test_stored_tensors_are_the_nvfp4_format_and_survive_a_round_trip():
    """Each matrix (each expert's of a stack) is quant's nvfp4 of that matrix, exactly; its global
    scale is on every row; quantizing what it stands for gives the same codes and block scales, and
    the global scale within one f32 rounding. An all-zero block is scale 0 and codes 0."""
    g = torch.Generator().manual_seed(3)
    w = torch.randn(3, 40, 64, generator=g) * torch.logspace(-3, 1, 40)[None, :, None]
    w[1, 7, 16:32] = 0.0
    got = stored({"e": w}, [Buffer("e", BufferKind.WEIGHT, DType.E2M1, (3, 40, 64))])
    for m in range(3):
        q = quant.quantize(w[m], "nvfp4")
        assert torch.equal(got["e"][m], q["weight"])
        assert torch.equal(got["e.block_scale"][m].view(torch.uint8), q["weight_scale"].view(torch.uint8))
        assert torch.equal(got["e.scale"][m], q["weight_scale_2"].expand(40))
    assert got["e.block_scale"][1, 7, 1].float() == 0 and not got["e"][1, 7, 8:16].any()
    deq = e2m1_weight(got["e"], got["e.block_scale"], got["e.scale"])
    assert torch.equal(deq[0], quant.dequantize(quant.quantize(w[0], "nvfp4"), "nvfp4"))
    again = stored({"e": deq}, [Buffer("e", BufferKind.WEIGHT, DType.E2M1, (3, 40, 64))])
    assert torch.equal(again["e"], got["e"])
    assert torch.equal(again["e.block_scale"].view(torch.uint8), got["e.block_scale"].view(torch.uint8))
    assert torch.allclose(again["e.scale"], got["e.scale"], rtol=2 ** -22, atol=0)


def test_validator_refuses_e2m1_without_its_scales_or_in_partial_pieces():
    p = lower(CFG, ScheduleConfig(dtype="f32", weights="nvfp4", capacity=16, n_sms=4))
    assert validate(p).ok
    got = changed(p, "layers.1.wo.block_scale", name="layers.1.wo.blocks")
    assert "[weight_scales] buffer 'layers.1.wo' is E2M1 but no buffer 'layers.1.wo.block_scale' holds its block "\
           "scales" in got, got
    got = changed(p, "layers.0.wq.block_scale", dtype=DType.BF16)
    assert any("the block scales of buffer 'layers.0.wq'" in r and "expected a F8E4M3 WEIGHT of shape (64, 4)" in r
               for r in got), got
    got = changed(p, "layers.0.wq.scale", shape=(3,))
    assert any("the row scales of buffer 'layers.0.wq'" in r for r in got), got
    got = changed(p, "layers.0.wq", kind=BufferKind.ACTIVATION)
    assert any("'layers.0.wq' is E2M1 but of kind ACTIVATION" in r for r in got), got
    p = lower(replace(CFG, ffn_dim=80), ScheduleConfig(dtype="f32", weights="nvfp4", capacity=16, n_sms=4))
    assert any("'layers.0.w_down' is E2M1 with rows of 80 codes" in r and "multiple of 32" in r
               for r in refusals(p)), refusals(p)


def test_bad_codes_scales_and_shapes_are_named_at_bind():
    _, _, _, _, p, w = _program()
    packed = pack(p, assign(p, 4))
    bad = dict(w)
    bad["layers.0.w_up.block_scale"] = w["layers.0.w_up.block_scale"].clone()
    bad["layers.0.w_up.block_scale"].view(torch.uint8)[3, 1] = 0x7F
    with pytest.raises(UserError, match=r"layers\.0\.w_up\.block_scale.*NaN code"):
        ReferenceVM(packed, bad)
    bad = dict(w, **{"layers.1.wk.scale": w["layers.1.wk.scale"].clone()})
    bad["layers.1.wk.scale"][2] = float("inf")
    with pytest.raises(UserError, match=r"layers\.1\.wk\.scale.*row scales of 'layers\.1\.wk'.*inf"):
        ReferenceVM(packed, bad)
    bad = dict(w, **{"layers.0.wo": torch.zeros(64, 64, dtype=torch.uint8)})
    with pytest.raises(UserError, match=r"layers\.0\.wo.*expects \(64, 32\) \(bytes of \(64, 64\) e2m1 codes\)"):
        ReferenceVM(packed, bad)


@pytest.mark.parametrize("name", ["llama-untied", "qwen3-qk-norm"])
def test_megavm_run_on_an_nvfp4_folder_matches_transformers(tmp_path, name, capsys):
    """`megavm quantize --format nvfp4` on a transformers checkpoint, then `megavm run --checkpoint` on
    the folder (ReferenceVM on the CPU, the projections stored as the folder's codes and scales): greedy
    tokens identical to transformers' own model class loaded with the weights the folder stands for,
    logits within 1e-4 of the largest (f32)."""
    from tests.hf_families import check_fp8_run
    check_fp8_run(name, tmp_path, "cpu", capsys, "nvfp4")


def test_bad_nvfp4_folders_are_named(tmp_path, capsys):
    from tests.hf_families import check_folder_refusals
    check_folder_refusals(tmp_path, "nvfp4", [
        (lambda t: t.__setitem__("model.layers.1.mlp.up_proj.weight_scale_2", torch.tensor(float("inf"))),
         "model.layers.1.mlp.up_proj.weight_scale_2 holds a scale that is NaN, inf or negative"),
        (lambda t: t["model.layers.0.self_attn.k_proj.weight_scale"].view(torch.uint8).__setitem__((2, 1), 0x7F),
         "model.layers.0.self_attn.k_proj.weight_scale holds a NaN code (e4m3 0x7f or 0xff) at [2, 1]"),
        (lambda t: t.__setitem__("model.layers.0.self_attn.o_proj.weight",
                                 t["model.layers.0.self_attn.o_proj.weight"].to(torch.int16)),
         "model.layers.0.self_attn.o_proj.weight: dtype I16; an nvfp4 folder holds it as U8"),
        (lambda t: t.__setitem__("lm_head.weight_scale", t["lm_head.weight_scale"][:7]),
         "lm_head.weight_scale: (7,"),
        (lambda t: t.__setitem__("model.layers.1.self_attn.v_proj.weight_scale",
                                 t["model.layers.1.self_attn.v_proj.weight_scale"].float()),
         "model.layers.1.self_attn.v_proj.weight_scale: dtype F32; an nvfp4 folder holds it as F8_E4M3"),
    ], capsys, config_edits=[("group_size", 32, "quantization_config.group_size=32 is not supported")])


def test_the_kernels_e2m1_bit_trick_is_exact():
    """instructions/codes.cuh (dot_e2m1x8) and gemv_mma.cuh (e2m1_pair) turn codes k and k + 4 of a
    32-bit word into one f16x2 by placing each nibble's exponent and mantissa bits on f16 bits 9..11
    and its sign on bit 15, and scale the sums by 2^14: for every word of eight codes, each half is exactly its code's e2m1 value times 2^-14."""
    g = torch.Generator().manual_seed(0)
    codes = torch.randint(0, 16, (4096, 8), generator=g, dtype=torch.int64)
    codes[:16, 0] = torch.arange(16)                      # every code in every place at least once
    words = sum(codes[:, k] << (4 * k) for k in range(8))
    want = quant.e2m1_values(codes.to(torch.uint8)) * 2.0 ** -14
    for k in range(4):
        t = words >> (4 * k)
        h = ((t & 0x00070007) << 9) | ((t & 0x00080008) << 12)
        lo, hi = (h & 0xFFFF).to(torch.int16), ((h >> 16) & 0xFFFF).to(torch.int16)
        for half, col in ((lo, k), (hi, k + 4)):
            got = half.view(torch.float16).float()
            assert torch.equal(got, want[:, col]), f"code {k}: {got[:4]} against {want[:4, col]}"
