"""fp8-block projection weights (ScheduleConfig(weights="fp8-block"); `megavm run --checkpoint` on a
folder in the Hugging Face "fp8" layout that `megavm quantize --format fp8-block` wrote): e4m3 codes
with an f32 scale per 128 x 128 block (`weight_scale_inv`), the scales in the weight's block_scale
buffer [ceil(rows/128), ceil(K/128)], no row scales; the GEMV multiplies each 16-code piece's sum by
its block's scale. On the CPU: the program is valid, the stored tensors are exactly the format's
(schedule/quant.py, held to the format's definition in test_quant.py), ReferenceVM computes the model
the codes and scales stand for, folders run against transformers, and bad tables, shapes and folders
are refused in one line."""
from dataclasses import replace

import pytest
import torch

from megavm.core.errors import ConfigError, UserError
from megavm.core.types import Buffer, BufferKind, DType
from megavm.flywheel.bench import bytes_read
from megavm.schedule import quant
from megavm.schedule.assign import assign
from megavm.schedule.config import ScheduleConfig
from megavm.schedule.eager import EagerDecoder
from megavm.schedule.lower import lower
from megavm.schedule.models import PRESETS, ModelConfig
from megavm.schedule.validate import validate
from megavm.schedule.weights import fp8_block_weight, stored, stored_exactly
from megavm.vm.pack import pack
from megavm.vm.reference import ReferenceVM
from tests.programs import changed, check_reference_decodes_quantized, quantized_program, refusals

# q rows 192 and k/v rows 64 (a partial block of rows), K = 208 and 304 (partial blocks of columns)
CFG = ModelConfig(dim=208, n_layers=2, n_heads=6, n_kv_heads=2, head_dim=32, ffn_dim=304, vocab=300,
                  tied_embeddings=True)
PROJ = ("wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down")


def test_projections_and_head_are_e4m3_with_block_scales():
    _, _, cfg8, _, p, w = quantized_program(CFG, "fp8-block")
    e4m3 = {b.name for b in p.buffers if b.dtype == DType.F8E4M3}
    assert e4m3 == {"lm_head"} | {f"layers.{l}.{n}" for l in range(2) for n in PROJ}
    for n in e4m3:
        rows, k = p.buffers[p.buffer_id(n)].shape
        t = p.buffers[p.buffer_id(n + ".block_scale")]
        assert (t.kind, t.dtype, t.shape) == (BufferKind.WEIGHT, DType.F32, (-(-rows // 128), -(-k // 128)))
        assert n + ".scale" not in p._names() and w[n].dtype == torch.float8_e4m3fn
    assert validate(p, assign(p, 4)).ok and not cfg8.tied_embeddings
    packed = pack(p, assign(p, 4))
    i = p.buffer_id("layers.0.wq")
    assert int(packed.buffers[i]["scale"]) == -1
    assert int(packed.buffers[i]["block_scale"]) == p.buffer_id("layers.0.wq.block_scale")


def test_stored_tensors_are_the_fp8_block_format():
    """Each matrix of a stack is quant's fp8-block of that matrix, exactly; an all-zero block is
    scale 0 and codes 0."""
    w = torch.randn(2, 200, 300, generator=torch.Generator().manual_seed(2)) * torch.logspace(-3, 1, 200)[None, :, None]
    w[1, 128:, 256:] = 0.0
    got = stored({"e": w}, [Buffer("e", BufferKind.WEIGHT, DType.F8E4M3, (2, 200, 300))], "fp8-block")
    for m in range(2):
        q = quant.quantize(w[m], "fp8-block")
        assert torch.equal(got["e"][m].view(torch.uint8), q["weight"].view(torch.uint8))
        assert torch.equal(got["e.block_scale"][m], q["weight_scale_inv"])
    assert got["e.block_scale"].shape == (2, 2, 3) and got["e.block_scale"][1, 1, 2] == 0
    deq = fp8_block_weight(got["e"], got["e.block_scale"])
    for m in range(2):
        assert torch.equal(deq[m], quant.dequantize({"weight": got["e"][m], "weight_scale_inv": got["e.block_scale"][m]},
                                                    "fp8-block"))
    again = stored({"e": fp8_block_weight(got["e"], got["e.block_scale"])},
                   [Buffer("e", BufferKind.WEIGHT, DType.F8E4M3, (2, 200, 300))], "fp8-block")
    assert torch.equal(again["e"].view(torch.uint8), got["e"].view(torch.uint8))
    assert torch.equal(again["e.block_scale"], got["e.block_scale"])


@pytest.mark.parametrize("n_sms", [1, 5])
def test_reference_vm_computes_what_the_codes_stand_for(n_sms):
    """ReferenceVM on the fp8-block tables against the eager model of the dequantized weights: tokens
    identical, logits within 1e-5 of the largest (f32); the unquantized model is 1e-2 or more away."""
    check_reference_decodes_quantized(CFG, "fp8-block", n_sms, 1e-2)


def test_mixture_of_experts_stacks_are_fp8_block_too():
    cfg = replace(CFG, n_experts=4, top_k=2, expert_ffn=128)
    _, _, cfg8, hf8, p, w = quantized_program(cfg, "fp8-block")
    assert p.buffers[p.buffer_id("layers.0.experts_down.block_scale")].shape == (4, 2, 1)
    out = ReferenceVM(pack(p, assign(p, 4)), w).step({"token": 3, "pos": 0})["logits"]
    ref = EagerDecoder(cfg8, hf8, 16).step(3, 0)
    assert ((out - ref).abs().max() / ref.abs().max()).item() <= 1e-5


def test_head_dims_that_do_not_divide_128_are_refused():
    with pytest.raises(ConfigError, match=r"weights='fp8-block' needs head_dim dividing 128, not 48"):
        lower(replace(CFG, head_dim=48, n_heads=4), ScheduleConfig(weights="fp8-block"))


def test_validator_refuses_bad_block_tables():
    p = lower(CFG, ScheduleConfig(dtype="f32", weights="fp8-block", capacity=16, n_sms=4))
    assert validate(p).ok
    got = changed(p, "layers.0.wq.block_scale", shape=(2, 1))
    assert any("the 128 x 128 block scales of buffer 'layers.0.wq'" in r and "expected a F32 WEIGHT of shape (2, 2)" in r
               for r in got), got
    both = replace(p, buffers=list(p.buffers) + [Buffer("layers.0.wq.scale", BufferKind.WEIGHT, DType.F32, (192,))])
    assert any("'layers.0.wq' has both row scales and 128 x 128 block scales" in r for r in refusals(both)), \
        refusals(both)
    p = lower(replace(CFG, n_experts=4, top_k=2, expert_ffn=96), ScheduleConfig(weights="fp8-block", n_sms=4))
    assert any("'layers.0.experts_gate' is a stack of e4m3 matrices of 96 rows with 128 x 128 block scales" in r
               for r in refusals(p)), refusals(p)


def test_bad_block_scales_are_named_at_bind():
    _, _, _, _, p, w = quantized_program(CFG, "fp8-block")
    packed = pack(p, assign(p, 4))
    t = w["layers.1.wk.block_scale"].clone()
    t[0, 1] = float("nan")
    with pytest.raises(UserError, match=r"layers\.1\.wk\.block_scale.*block scales of 'layers\.1\.wk'.*nan at \[0, 1\]"):
        ReferenceVM(packed, dict(w, **{"layers.1.wk.block_scale": t}))
    t = w["lm_head.block_scale"].clone()
    t[2, 0] = -1.0
    with pytest.raises(UserError, match=r"lm_head\.block_scale.*holds -1\.0 at \[2, 0\]"):
        ReferenceVM(packed, dict(w, **{"lm_head.block_scale": t}))


def test_stored_exactly_refuses_blocks_not_scaled_by_their_amax():
    w = torch.randn(130, 256, generator=torch.Generator().manual_seed(1))
    q = quant.quantize(w, "fp8-block")
    deq = quant.dequantize(q, "fp8-block")
    bufs = [Buffer("w", BufferKind.WEIGHT, DType.F8E4M3, (130, 256)),
            Buffer("w.block_scale", BufferKind.WEIGHT, DType.F32, (2, 2))]
    assert torch.equal(stored_exactly({"w": deq}, bufs, "fp8-block")["w"].view(torch.uint8), q["weight"].view(torch.uint8))
    deq[129, 3] = deq[129].abs().max() * 3 / 7 * 1.0001                # no longer a code of its block's scale
    with pytest.raises(UserError, match=r"weight 'w': its fp8 128 x 128 blocks are not scaled .* \(row 129\)"):
        stored_exactly({"w": deq}, bufs, "fp8-block")


def test_bytes_read_counts_a_byte_a_weight_and_four_a_block():
    cfg = PRESETS["llama-1b"]
    proj = cfg.n_layers * (cfg.dim * (2 * cfg.n_heads * cfg.head_dim + 2 * cfg.n_kv_heads * cfg.head_dim)
                           + 3 * cfg.dim * cfg.ffn_dim) + cfg.vocab * cfg.dim
    assert abs(bytes_read(cfg, 128) - bytes_read(cfg, 128, "fp8-block") - proj * (1 - 4 / 128 ** 2)) < 1


@pytest.mark.parametrize("name", ["llama-untied", "qwen3-qk-norm"])
def test_megavm_run_on_an_fp8_block_folder_matches_transformers(tmp_path, name, capsys):
    """`megavm quantize --format fp8-block` on a transformers checkpoint, then `megavm run --checkpoint`
    on the folder (ReferenceVM on the CPU): greedy tokens identical to transformers' own model class
    loaded with the weights the folder stands for, logits within 1e-4 of the largest (f32)."""
    from tests.hf_families import check_fp8_run
    check_fp8_run(name, tmp_path, "cpu", capsys, "fp8-block")


def test_bad_fp8_block_folders_are_named(tmp_path, capsys):
    from tests.hf_families import check_folder_refusals
    check_folder_refusals(tmp_path, "fp8-block", [
        (lambda t: t["model.layers.1.mlp.up_proj.weight_scale_inv"].__setitem__((0, 0), float("nan")),
         "model.layers.1.mlp.up_proj.weight_scale_inv holds a scale that is NaN, inf or negative (row 0)"),
        (lambda t: t["model.layers.0.self_attn.k_proj.weight"].view(torch.uint8).__setitem__((2, 3), 0xFF),
         "model.layers.0.self_attn.k_proj.weight holds a NaN code (e4m3 0x7f or 0xff) at [2, 3]"),
        (lambda t: t.__setitem__("lm_head.weight_scale_inv", torch.ones(2, 2)),
         "lm_head.weight_scale_inv: (2, 2), expected (3, 1)"),
    ], capsys, config_edits=[("weight_block_size", [64, 64], "quantization_config.weight_block_size=[64, 64] is not supported")])
