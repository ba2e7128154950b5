"""int4 projection weights (ScheduleConfig(weights="int4"); `megavm run --checkpoint` on an AWQ folder
that `megavm quantize --format int4` wrote): 4-bit codes two to a byte, each group of 128 as
(code - zero) x an f16 scale, the pairs in an F16 group table beside the codes (no row scales),
streamed by the GEMV and dequantized in registers. On the CPU: the program is valid, the tables hold
exactly the AWQ file's codes, zero points and scales (AutoAWQ's formula, schedule/quant.py, is held
to its published definition in test_quant.py), ReferenceVM computes the model they stand for, folders
run against transformers, and bad tables, shapes and folders are refused in one line."""

import pytest
import torch

from megavm.core.errors import UserError
from megavm.core.types import Buffer, BufferKind, DType
from megavm.flywheel.bench import bytes_read
from megavm.schedule import quant
from megavm.schedule.assign import assign
from megavm.schedule.config import ScheduleConfig
from megavm.schedule.eager import EagerDecoder
from megavm.schedule.lower import lower
from megavm.schedule.models import PRESETS, ModelConfig
from megavm.schedule.validate import validate
from megavm.schedule.weights import int4_tables, stored, stored_exactly, u4_weight
from megavm.vm.pack import pack
from megavm.vm.reference import ReferenceVM
from tests.programs import changed, check_reference_decodes_quantized, quantized_program

CFG = ModelConfig(dim=128, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=32, ffn_dim=256, vocab=200,
                  tied_embeddings=True)
PROJ = ("wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down")


def _awq(out: int = 16, k: int = 384, seed: int = 0) -> dict[str, torch.Tensor]:
    """AWQ tensors of a random [out, k] weight with adversarial groups: an all-zero group, a constant
    group, and groups of rows spanning 9 binades."""
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(out, k, generator=g) * torch.exp2(torch.randint(-6, 4, (out, 1), generator=g).float())
    w[1, 128:256] = 0.0
    w[2, :128] = 0.75
    return quant.quantize(w, "int4")


def test_tables_hold_the_awq_files_codes_zero_points_and_scales():
    """int4_tables of what an AWQ matrix stands for: its codes (element 2i in the low nibble), and per
    group its f16 scale and zero point, exactly as the file has them; u4_weight gives the same values."""
    t = _awq()
    deq = quant.dequantize(t, "int4")
    codes, table, exact = int4_tables(deq)
    assert bool(exact.all())
    assert torch.equal(quant.unpack_nibbles(codes).int(), quant.unpack_awq(t["qweight"]).t())
    assert table.dtype == torch.float16 and table.shape == (16, 3, 2)
    assert torch.equal(table[..., 0], t["scales"].t())
    assert torch.equal(table[..., 1].int(), quant.unpack_awq(t["qzeros"]).t())
    assert torch.equal(u4_weight(codes, table), deq)


def test_groups_whose_codes_do_not_reach_15_apart_are_recovered_exactly():
    """A group whose codes span 3 .. 9 (an AWQ file clipped so) is still held exactly, by the finest
    scale that holds it (span / 12: half the file's, codes twice as far apart); an all-zero group is
    codes 0 and zero point 0; a group no zero point and f16 scale give is refused by stored_exactly,
    naming the weight and the group."""
    q = torch.randint(3, 10, (8, 128))
    q[:, 0], q[:, 1] = 3, 9
    s = torch.full((8,), 0.0371).half().float()
    w = (q - 5).float() * s[:, None]
    w = torch.cat([w, torch.zeros(8, 128)], 1)
    codes, table, exact = int4_tables(w)
    assert bool(exact.all()) and torch.equal(u4_weight(codes, table), w)
    assert torch.equal(table[:, 0, 0].float(), s / 2) and (table[:, 0, 1] == 4).all()
    assert (table[:, 1, 1] == 0).all() and (quant.unpack_nibbles(codes)[:, 128:] == 0).all()
    bad = w.clone()
    bad[3, 7] = 0.01                                       # not a multiple of the group's scale
    buf = Buffer("w", BufferKind.WEIGHT, DType.U4, (8, 256))
    assert not bool(int4_tables(bad)[2][3, 0])
    with pytest.raises(UserError, match=r"weight 'w': group \[3, 0\] of its int4 codes is not"):
        stored_exactly({"w": bad}, [buf, Buffer("w.block_scale", BufferKind.WEIGHT, DType.F16, (8, 2, 2))], "int4")


def test_projections_and_head_are_u4_with_group_tables():
    _, _, cfg4, _, p, w = quantized_program(CFG, "int4")
    u4 = {b.name for b in p.buffers if b.dtype == DType.U4}
    assert u4 == {"lm_head"} | {f"layers.{l}.{n}" for l in range(2) for n in PROJ}
    for n in u4:
        shape = p.buffers[p.buffer_id(n)].shape
        t = p.buffers[p.buffer_id(n + ".block_scale")]
        assert (t.kind, t.dtype, t.shape) == (BufferKind.WEIGHT, DType.F16, (*shape[:-1], shape[-1] // 128, 2))
        assert n + ".scale" not in p._names()
        assert w[n].dtype == torch.uint8 and tuple(w[n].shape) == (*shape[:-1], shape[-1] // 2)
        assert p.buffers[p.buffer_id(n)].nbytes == w[n].numel()
    assert validate(p, assign(p, 4)).ok and not cfg4.tied_embeddings
    packed = pack(p, assign(p, 4))
    i = p.buffer_id("layers.0.wq")
    assert int(packed.buffers[i]["scale"]) == -1
    assert int(packed.buffers[i]["block_scale"]) == p.buffer_id("layers.0.wq.block_scale")


@pytest.mark.parametrize("n_sms", [1, 5])
def test_reference_vm_computes_what_the_codes_stand_for(n_sms):
    """ReferenceVM on the int4 tables against the eager model of the dequantized weights: tokens
    identical, logits within 1e-5 of the largest (f32); the unquantized model is 5e-2 or more away."""
    check_reference_decodes_quantized(CFG, "int4", n_sms, 5e-2)


def test_mixture_of_experts_stacks_are_int4_too():
    cfg = ModelConfig(dim=128, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=32, ffn_dim=256, vocab=200,
                      n_experts=4, top_k=2, expert_ffn=128)
    _, _, cfg4, hf4, p, w = quantized_program(cfg, "int4")
    assert p.buffers[p.buffer_id("layers.0.experts_gate")].dtype == DType.U4
    assert p.buffers[p.buffer_id("layers.0.experts_gate.block_scale")].shape == (4, 128, 1, 2)
    out = ReferenceVM(pack(p, assign(p, 4)), w).step({"token": 3, "pos": 0})["logits"]
    ref = EagerDecoder(cfg4, hf4, 16).step(3, 0)
    assert ((out - ref).abs().max() / ref.abs().max()).item() <= 1e-5


def test_validator_refuses_u4_without_its_table_or_in_partial_groups():
    p = lower(CFG, ScheduleConfig(dtype="f32", weights="int4", capacity=16, n_sms=4))
    assert validate(p).ok
    got = changed(p, "layers.1.wo.block_scale", name="layers.1.wo.groups")
    assert any("[weight_scales] buffer 'layers.1.wo' is U4 but no buffer 'layers.1.wo.block_scale' holds its group "
               "scales and zero points" in r for r in got), got
    assert any("'layers.1.wo.groups' is F16, which megavm stores only as the group table of an int4" in r
               for r in got), got
    got = changed(p, "layers.0.wq.block_scale", shape=(128, 2))
    assert any("the group scales and zero points of buffer 'layers.0.wq'" in r and
               "expected a F16 WEIGHT of shape (128, 1, 2)" in r for r in got), got
    got = changed(p, "layers.0.wq", kind=BufferKind.ACTIVATION)
    assert any("'layers.0.wq' is U4 but of kind ACTIVATION" in r for r in got), got
    got = changed(p, "layers.0.w_down", shape=(128, 192))
    assert any("'layers.0.w_down' is U4 with rows of 192 codes; the GEMV reads int4 rows in groups of 128" in r
               for r in got), got


def test_bad_tables_and_shapes_are_named_at_bind():
    _, _, _, _, p, w = quantized_program(CFG, "int4")
    packed = pack(p, assign(p, 4))
    bad = dict(w)
    t = w["layers.1.wk.block_scale"].clone()
    t[3, 0, 0] = float("nan")
    bad["layers.1.wk.block_scale"] = t
    with pytest.raises(UserError, match=r"layers\.1\.wk\.block_scale.*group table of 'layers\.1\.wk'.*scale nan at group \[3, 0\]"):
        ReferenceVM(packed, bad)
    t = w["layers.0.w_down.block_scale"].clone()
    t[5, 1, 1] = 16
    bad = dict(w, **{"layers.0.w_down.block_scale": t})
    with pytest.raises(UserError, match=r"zero point 16\.0 at group \[5, 1\] \(int4 zero points are 0 \.\. 15\)"):
        ReferenceVM(packed, bad)
    bad = dict(w, **{"layers.0.wo": torch.zeros(128, 128, dtype=torch.uint8)})
    with pytest.raises(UserError, match=r"layers\.0\.wo.*expects \(128, 64\) \(bytes of \(128, 128\) u4 codes\)"):
        ReferenceVM(packed, bad)


def test_bytes_read_counts_awqs_own_bytes():
    cfg = PRESETS["llama-1b"]
    proj = cfg.n_layers * (cfg.dim * (2 * cfg.n_heads * cfg.head_dim + 2 * cfg.n_kv_heads * cfg.head_dim)
                           + 3 * cfg.dim * cfg.ffn_dim) + cfg.vocab * cfg.dim
    assert bytes_read(cfg, 128) - bytes_read(cfg, 128, "int4") == proj * (2 - 0.5 - 2.5 / 128)


def test_stored_of_random_weights_is_autoawqs_quantization():
    """stored() of weights no int4 matrix stands for: each group gets AutoAWQ's own codes, scale and
    zero point (quant.quantize), so a model of them can be quantized by the lowering directly."""
    w = torch.randn(16, 256, generator=torch.Generator().manual_seed(4))
    got = stored({"w": w}, [Buffer("w", BufferKind.WEIGHT, DType.U4, (16, 256))], "int4")
    t = quant.quantize(w, "int4")
    assert torch.equal(quant.unpack_nibbles(got["w"]).int(), quant.unpack_awq(t["qweight"]).t())
    assert torch.equal(got["w.block_scale"][..., 0], t["scales"].t())


@pytest.mark.parametrize("name", ["llama-int4", "qwen3-int4"])
def test_megavm_run_on_an_int4_folder_matches_transformers(tmp_path, name, capsys):
    """`megavm quantize --format int4` on a transformers checkpoint, then `megavm run --checkpoint` on
    the AWQ folder (ReferenceVM on the CPU): greedy tokens identical to transformers' own model class
    loaded with the weights the folder stands for, logits within 1e-4 of the largest (f32)."""
    from tests.hf_families import check_fp8_run
    check_fp8_run(name, tmp_path, "cpu", capsys, "int4")


def test_bad_int4_folders_are_named(tmp_path, capsys):
    from tests.hf_families import check_folder_refusals
    check_folder_refusals(tmp_path, "int4", [
        (lambda t: t["model.layers.1.mlp.up_proj.scales"].__setitem__((0, 5), float("inf")),
         "model.layers.1.mlp.up_proj.scales holds a scale that is NaN, inf or negative at [0, 5]"),
        (lambda t: t.__setitem__("model.layers.0.self_attn.o_proj.qweight",
                                 t["model.layers.0.self_attn.o_proj.qweight"].to(torch.int16)),
         "model.layers.0.self_attn.o_proj.qweight: dtype I16; an int4 folder holds it as I32"),
        (lambda t: t.__setitem__("lm_head.qzeros", t["lm_head.qzeros"][:, :7]),
         "lm_head.qzeros: (1, 7), expected (1, 38)"),
        (lambda t: t.__setitem__("model.layers.1.self_attn.v_proj.scales",
                                 t["model.layers.1.self_attn.v_proj.scales"].float()),
         "model.layers.1.self_attn.v_proj.scales: dtype F32; an int4 folder holds it as F16"),
    ], capsys, case="llama-int4", config_edits=[("group_size", 64, "quantization_config.group_size=64 is not supported")])
