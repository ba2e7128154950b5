"""MXFP4 projection weights (ScheduleConfig(weights="mxfp4"), `megavm run --checkpoint` on an mxfp4
folder): e2m1 codes with a power of two (e8m0) per 32, run through the E2M1 tables of the nvfp4 path.
Each block's 2^(e - 127) becomes two e4m3 block scales 2^(e - E + 8) over a row scale 2^(E - 135)
(schedule/weights.py: mxfp4_tables), which is exact while a row's exponents span at most 17
binades; a row past that is refused naming the weight. On the CPU: the tables stand for exactly what
the format's dequantization (schedule/quant.py, itself held to the OCP MX spec in test_quant.py) gives,
ReferenceVM decodes as the eager model of those weights (test_fp8_weights.py, parametrized over the
formats), and folders run against transformers and are refused in one line where they cannot run."""
import pytest
import torch

from megavm.core.errors import UserError
from megavm.core.types import Buffer, BufferKind, DType
from megavm.schedule import quant
from megavm.schedule.weights import MX_SPAN, e2m1_weight, mxfp4_tables, stored


def _mx(rows: int = 6, k: int = 128, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(rows, k, generator=g) * torch.exp2(torch.randint(-6, 7, (rows, 1), generator=g).float())
    w[1] = 0                                                           # an all-zero row
    w[2, 32:64] = 0                                                    # an all-zero block
    w[3, :32] *= 2.0 ** 12                                             # a row spanning 12+ binades
    return quant.quantize(w, "mxfp4")


def test_tables_stand_for_the_format_exactly():
    q = _mx()
    t = mxfp4_tables(q["weight_blocks"], q["weight_scales"], "w")
    assert torch.equal(e2m1_weight(t["codes"], t["block"], t["rows"]), quant.dequantize(q, "mxfp4"))
    assert torch.equal(t["codes"], q["weight_blocks"].reshape(6, 64))          # the codes as the file has them
    assert t["block"].dtype == torch.float8_e4m3fn and t["block"].shape == (6, 8)
    assert (t["block"][1].float() == 0).all() and (t["block"][2, 2:4].float() == 0).all()
    assert t["block"].float().max() == 256 and torch.isfinite(t["rows"]).all()


def test_stored_tables_survive_a_round_trip():
    """stored() of what mxfp4 codes stand for (a stack of two matrices): the same values back, exactly
    (a block whose largest code is below 4 comes back with a smaller exponent and larger codes)."""
    q = [_mx(seed=s) for s in (0, 1)]
    deq = torch.stack([quant.dequantize(x, "mxfp4") for x in q])
    got = stored({"e": deq}, [Buffer("e", BufferKind.WEIGHT, DType.E2M1, (2, 6, 128))], "mxfp4")
    assert got["e"].shape == (2, 6, 64) and got["e.block_scale"].shape == (2, 6, 8) and got["e.scale"].shape == (2, 6)
    assert torch.equal(e2m1_weight(got["e"], got["e.block_scale"], got["e.scale"]), deq)


@pytest.mark.parametrize("span,ok", [(MX_SPAN, True), (MX_SPAN + 1, False)])
def test_a_row_whose_exponents_span_too_far_is_refused(span, ok):
    blocks = torch.full((2, 4, 16), 0x11, dtype=torch.uint8)           # codes 0.5 everywhere
    scales = torch.full((2, 4), 127, dtype=torch.uint8)
    scales[1, 2] = 127 - span
    if ok:
        t = mxfp4_tables(blocks, scales, "w")
        assert torch.equal(e2m1_weight(t["codes"], t["block"], t["rows"]),
                           quant.dequantize({"weight_blocks": blocks, "weight_scales": scales}, "mxfp4"))
    else:
        with pytest.raises(UserError, match=rf"weight 'w': row 1's mxfp4 block exponents span more than {MX_SPAN}"):
            mxfp4_tables(blocks, scales, "w")
    scales[0, 0] = 255
    with pytest.raises(UserError, match="weight 'w': an mxfp4 scale is 255"):
        mxfp4_tables(blocks, scales, "w")


@pytest.mark.parametrize("name", ["llama-untied", "qwen3-qk-norm"])
def test_megavm_run_on_an_mxfp4_folder_matches_transformers(tmp_path, name, capsys):
    """`megavm quantize --format mxfp4` on a transformers checkpoint, then `megavm run --checkpoint`
    (ReferenceVM on the CPU): greedy tokens identical to transformers' own model class loaded with the
    weights the folder stands for, logits within 1e-4 of the largest (f32)."""
    from tests.hf_families import check_fp8_run
    check_fp8_run(name, tmp_path, "cpu", capsys, "mxfp4")


def test_bad_mxfp4_folders_are_named(tmp_path, capsys):
    from tests.hf_families import check_folder_refusals

    def spread(t):
        s = t["model.layers.0.mlp.down_proj.weight_scales"]
        s[3] = s[3].max()
        s[3, 0] = int(s[3].max()) - MX_SPAN - 3
        t["model.layers.0.mlp.down_proj.weight_blocks"][3, 0] = 0x77     # codes 6: a live block
    check_folder_refusals(tmp_path, "mxfp4", [
        (lambda t: t["model.layers.1.self_attn.q_proj.weight_scales"].__setitem__((0, 1), 255),
         "model.layers.1.self_attn.q_proj.weight_scales holds the NaN exponent 255 at [0, 1]"),
        (lambda t: t.__setitem__("lm_head.weight_blocks", t["lm_head.weight_blocks"][:5]),
         "lm_head.weight_blocks: (5,"),
        (lambda t: t.__setitem__("model.layers.0.self_attn.o_proj.weight_scales",
                                 t["model.layers.0.self_attn.o_proj.weight_scales"].to(torch.int16)),
         "model.layers.0.self_attn.o_proj.weight_scales: dtype I16; an mxfp4 folder holds it as U8"),
        (spread, "weight 'layers.0.w_down': row 3's mxfp4 block exponents span more than 17 binades"),
    ], capsys)
