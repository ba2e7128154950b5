"""F8E4M3 projection weights (ScheduleConfig(weights="fp8")): e4m3 codes with an f32 scale per output
row, streamed by the GEMV and dequantized in registers. On the CPU: the program is valid, ReferenceVM
computes the model the codes and scales stand for (the eager model of schedule.weights.quantized_model),
the stored codes and scales are exactly the fp8 format's (schedule/quant.py, itself held to torch's
float8_e4m3fn conversion in test_quant.py), and bad tables or weights are refused naming the buffer."""
from dataclasses import replace

import pytest
import torch

from megavm.core.errors import ConfigError, UserError
from megavm.core.types import BufferKind, DType
from megavm.flywheel.bench import bytes_read
from megavm.schedule import quant
from megavm.schedule.assign import assign
from megavm.schedule.config import ScheduleConfig
from megavm.schedule.eager import EagerDecoder
from megavm.schedule.lower import lower
from megavm.schedule.models import PRESETS, ModelConfig
from megavm.schedule.validate import validate
from megavm.schedule.weights import stored
from megavm.vm.pack import pack
from megavm.vm.reference import ReferenceVM
from tests.programs import check_reference_decodes_quantized, quantized_program, refusals

CFG = ModelConfig(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16, ffn_dim=96, vocab=200,
                  tied_embeddings=True)


def _program(cfg=CFG, dtype="f32", n_sms=4, seed=1):
    return quantized_program(cfg, "fp8", dtype, n_sms, seed)


def test_projections_and_head_are_e4m3_with_row_scales():
    _, _, cfg8, _, p, w = _program()
    e4m3 = {b.name for b in p.buffers if b.dtype == DType.F8E4M3}
    assert e4m3 == {"lm_head"} | {f"layers.{l}.{n}" for l in range(2) for n in ("wq", "wk", "wv", "wo", "w_gate",
                                                                               "w_up", "w_down")}
    for n in e4m3:
        s = p.buffers[p.buffer_id(n + ".scale")]
        assert (s.kind, s.dtype, s.shape) == (BufferKind.WEIGHT, DType.F32, p.buffers[p.buffer_id(n)].shape[:-1])
        assert w[n].dtype == torch.float8_e4m3fn and w[n + ".scale"].dtype == torch.float32
    assert p.buffers[p.buffer_id("tok_emb")].dtype == DType.F32 and not cfg8.tied_embeddings
    assert validate(p, assign(p, 4)).ok


@pytest.mark.parametrize("fmt,far_from_plain", [("fp8", 1e-2), ("nvfp4", 5e-2), ("mxfp4", 5e-2)])
@pytest.mark.parametrize("n_sms", [1, 5])
def test_reference_vm_computes_what_the_codes_stand_for(n_sms, fmt, far_from_plain):
    """ReferenceVM on the fp8 (nvfp4, mxfp4) tables against the eager model of the dequantized weights:
    tokens identical, logits within 1e-5 of the largest (f32); the unquantized model is 1e-2 (5e-2) or
    more away (test_int4_weights.py and test_fp8_block_weights.py hold those formats the same way)."""
    check_reference_decodes_quantized(CFG, fmt, n_sms, far_from_plain)


def test_stored_codes_and_scales_are_the_fp8_format():
    """Each row of each stored weight is schedule.quant's fp8 of that row, exactly (experts' stacks
    too: a row is a row of one expert's matrix)."""
    w = torch.randn(3, 40, 32) * torch.logspace(-3, 1, 40)[None, :, None]
    w[1, 7] = 0.0                                           # an all-zero row: scale 0, codes 0
    from megavm.core.types import Buffer
    got = stored({"e": w, "d": w[0]}, [Buffer("e", BufferKind.WEIGHT, DType.F8E4M3, (3, 40, 32)),
                                       Buffer("d", BufferKind.WEIGHT, DType.F8E4M3, (40, 32))])
    q = quant.quantize(w.reshape(120, 32), "fp8")
    assert torch.equal(got["e"].view(torch.uint8).reshape(120, 32), q["weight"].view(torch.uint8))
    assert torch.equal(got["e.scale"].reshape(120), q["weight_scale"].reshape(120))
    assert torch.equal(got["d"].view(torch.uint8), got["e"][0].view(torch.uint8))
    assert got["e.scale"][1, 7] == 0 and not got["e"][1, 7].float().any()
    deq = got["e"].float() * got["e.scale"].unsqueeze(-1)
    assert torch.isfinite(deq).all() and ((deq - w).abs() <= w.abs().amax(-1, keepdim=True) / 16 + 1e-30).all()


@pytest.mark.parametrize("fmt,dtype", [("fp8", DType.F8E4M3), ("nvfp4", DType.E2M1), ("mxfp4", DType.E2M1)])
def test_mixture_of_experts_stacks_are_quantized_too(fmt, dtype):
    """Expert stacks in fp8 (nvfp4: each expert's matrix with its own global scale) decode as the
    eager model of what they stand for (1e-5, f32)."""
    cfg = PRESETS["moe-tiny"]
    _, _, cfg8, hf8, p, w = quantized_program(cfg, fmt)
    assert p.buffers[p.buffer_id("layers.0.experts_gate")].dtype == dtype
    assert p.buffers[p.buffer_id("layers.0.router")].dtype == DType.F32        # the router stays exact
    vm = ReferenceVM(pack(p, assign(p, 4)), w)
    ref = EagerDecoder(cfg8, hf8, 16).step(3, 0)
    out = vm.step({"token": 3, "pos": 0})["logits"]
    assert ((out - ref).abs().max() / ref.abs().max()).item() <= 1e-5



def test_validator_refuses_e4m3_without_its_scales():
    _, _, _, _, p, _ = _program()
    s = p.buffer_id("layers.0.wq.scale")
    bad = replace(p, buffers=list(p.buffers))
    bad.buffers[s] = replace(p.buffers[s], name="layers.0.wq.scales")
    assert any("'layers.0.wq' is F8E4M3 but no buffer 'layers.0.wq.scale' holds its row scales" in m
               for m in refusals(bad)), refusals(bad)
    bad = replace(p, buffers=list(p.buffers))
    bad.buffers[s] = replace(p.buffers[s], shape=(3,))
    assert any("the row scales of buffer 'layers.0.wq'" in m and "expected a F32 WEIGHT of shape (64,)" in m
               for m in refusals(bad)), refusals(bad)


def test_validator_refuses_e4m3_rows_of_partial_pieces_and_e4m3_activations():
    cfg = replace(CFG, dim=72, n_heads=4, head_dim=18)     # q/k/v rows of 72 codes: not whole 16-byte pieces
    p = lower(cfg, ScheduleConfig(dtype="f32", weights="fp8", capacity=16, n_sms=4))
    assert any("'layers.0.wq' is F8E4M3 with rows of 72 codes" in m for m in refusals(p)), refusals(p)
    _, _, _, _, p, _ = _program()
    x = p.buffer_id("x.1")
    bad = replace(p, buffers=list(p.buffers))
    bad.buffers[x] = replace(p.buffers[x], dtype=DType.F8E4M3)
    assert any("'x.1' is F8E4M3 but of kind ACTIVATION" in m for m in refusals(bad)), refusals(bad)


def test_bad_codes_and_scales_are_named_at_bind():
    _, _, _, _, p, w = _program()
    pk = pack(p, assign(p, 4))
    nan = dict(w)
    nan["layers.1.w_up"] = w["layers.1.w_up"].clone()
    nan["layers.1.w_up"].view(torch.uint8)[3, 5] = 0x7F
    with pytest.raises(UserError, match=r"weight 'layers.1.w_up' holds a NaN code \(e4m3 0x7f or 0xff\) at \[3, 5\]"):
        ReferenceVM(pk, nan)
    inf = dict(w)
    inf["lm_head.scale"] = w["lm_head.scale"].clone()
    inf["lm_head.scale"][9] = float("inf")
    with pytest.raises(UserError, match=r"weight 'lm_head.scale' \(the row scales of 'lm_head'\) holds inf at \[9\]"):
        ReferenceVM(pk, inf)
    wrong = dict(w)
    wrong["layers.0.wk"] = w["layers.0.wk"].float()
    with pytest.raises(UserError, match="weight 'layers.0.wk' has dtype torch.float32, the program expects "
                                        "torch.float8_e4m3fn"):
        ReferenceVM(pk, wrong)


def test_unknown_weight_format_is_refused():
    with pytest.raises(ConfigError, match=r"weights='int8': megavm stores projections as \['', 'fp8', 'fp8-block', "
                                          r"'int4', 'mxfp4', 'nvfp4'\]"):
        lower(CFG, ScheduleConfig(weights="int8"))


def test_bytes_read_counts_one_byte_a_weight_and_four_a_row():
    cfg = PRESETS["llama-1b"]
    bf16, fp8 = bytes_read(cfg, 128), bytes_read(cfg, 128, "fp8")
    # rows: q, k, v, o, gate, up, down per layer, and the (tied, so separately stored) head
    rows = cfg.n_layers * (cfg.n_heads * cfg.head_dim + 2 * cfg.n_kv_heads * cfg.head_dim + 2 * cfg.dim
                           + 2 * cfg.ffn_dim) + cfg.vocab
    proj = cfg.n_layers * (cfg.dim * (2 * cfg.n_heads * cfg.head_dim + 2 * cfg.n_kv_heads * cfg.head_dim)
                           + 3 * cfg.dim * cfg.ffn_dim) + cfg.vocab * cfg.dim
    assert bf16 - fp8 == proj - 4 * rows
    assert bf16 - bytes_read(cfg, 128, "nvfp4") == proj * (2 - 0.5 - 1 / 16) - 4 * rows
    assert bf16 - bytes_read(cfg, 128, "mxfp4") == proj * (2 - 0.5 - 1 / 32)           # no row scales


@pytest.mark.parametrize("name", ["llama-untied", "qwen3-qk-norm"])
def test_megavm_run_on_an_fp8_folder_matches_transformers(tmp_path, name, capsys):
    """`megavm quantize --format fp8` on a transformers checkpoint, then `megavm run --checkpoint` on
    the fp8 folder (ReferenceVM on the CPU, the projections stored as the folder's codes and scales):
    greedy tokens identical to transformers' own model class loaded with the weights the folder stands
    for (its tied head untied, as the folder has it), logits within 1e-4 of the largest (f32)."""
    from tests.hf_families import check_fp8_run
    check_fp8_run(name, tmp_path, "cpu", capsys)


def test_bad_fp8_folders_are_named(tmp_path, capsys):
    from tests.hf_families import check_folder_refusals
    check_folder_refusals(tmp_path, "fp8", [
        (lambda t: t["model.layers.1.mlp.up_proj.weight_scale"].__setitem__((5, 0), float("nan")),
         "model.layers.1.mlp.up_proj.weight_scale holds a scale that is NaN, inf or negative (row 5)"),
        (lambda t: t["model.layers.0.self_attn.k_proj.weight"].view(torch.uint8).__setitem__((2, 3), 0xFF),
         "model.layers.0.self_attn.k_proj.weight holds a NaN code (e4m3 0x7f or 0xff) at [2, 3]"),
        (lambda t: t.__setitem__("model.layers.0.self_attn.o_proj.weight", t["model.layers.0.self_attn.o_proj.weight"].float()),
         "model.layers.0.self_attn.o_proj.weight: dtype F32; an fp8 folder holds it as F8_E4M3"),
        (lambda t: t.__setitem__("lm_head.weight_scale", t["lm_head.weight_scale"][:7]),
         "lm_head.weight_scale: (7, 1), expected (301, 1)"),
    ], capsys)
