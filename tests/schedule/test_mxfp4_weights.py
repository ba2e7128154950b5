"""MXFP4 projection weights (ScheduleConfig(weights="mxfp4"), `megavm run --checkpoint` on an mxfp4
folder): e2m1 codes two to a byte with a biased e8m0 exponent per 32 codes (the weight's E8M0
block_scale buffer, no row scales), the format's own bytes, read by the GEMV as they are (each piece
of 32 codes is one block: its sum times 2^(e - 127)). On the CPU: the stored tensors are the format's
(schedule/quant.py, held to the OCP MX spec in test_quant.py) and stand for exactly what it
dequantizes to, at any spread of exponents; ReferenceVM decodes as the eager model of those weights
(test_fp8_weights.py, parametrized over the formats); folders run against transformers and bad ones
are refused in one line."""
import pytest
import torch

from megavm.core.errors import UserError
from megavm.core.types import Buffer, BufferKind, DType
from megavm.schedule import quant
from megavm.schedule.assign import assign
from megavm.schedule.models import ModelConfig
from megavm.schedule.validate import validate
from megavm.schedule.weights import mx_weight, stored
from megavm.vm.pack import pack
from megavm.vm.reference import ReferenceVM
from tests.programs import changed, quantized_program

CFG = ModelConfig(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16, ffn_dim=96, vocab=200,
                  tied_embeddings=True)


def _mx(rows: int = 6, k: int = 128, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(rows, k, generator=g) * torch.exp2(torch.randint(-6, 7, (rows, 1), generator=g).float())
    w[1] = 0                                                           # an all-zero row
    w[2, 32:64] = 0                                                    # an all-zero block
    w[3, :32] *= 2.0 ** 40                                             # a row spanning 40+ binades
    w[4, 32:64] *= 2.0 ** -100                                         # a block far below its row
    return quant.quantize(w, "mxfp4")


def test_stored_tensors_are_the_format_and_stand_for_it_exactly():
    """stored() of what mxfp4 tensors stand for (a stack of two matrices, rows spanning 40 and 100
    binades): codes [.., K/2] and exponents [.., K/32] as the format defines them, the same values back
    exactly (a block whose largest code is below 4 comes back with a smaller exponent and larger codes)."""
    q = [_mx(seed=s) for s in (0, 1)]
    deq = torch.stack([quant.dequantize(x, "mxfp4") for x in q])
    got = stored({"e": deq}, [Buffer("e", BufferKind.WEIGHT, DType.E2M1, (2, 6, 128))], "mxfp4")
    assert got["e"].shape == (2, 6, 64) and got["e.block_scale"].shape == (2, 6, 4) and "e.scale" not in got
    assert got["e.block_scale"].dtype == torch.uint8
    assert torch.equal(mx_weight(got["e"], got["e.block_scale"]), deq)
    again = quant.quantize(deq[0], "mxfp4")
    assert torch.equal(got["e"][0], again["weight_blocks"].reshape(6, 64))
    assert torch.equal(got["e.block_scale"][0], again["weight_scales"])


def test_program_holds_e8m0_exponents_and_no_row_scales():
    _, _, _, _, p, w = quantized_program(CFG, "mxfp4")
    t = p.buffers[p.buffer_id("layers.0.wq.block_scale")]
    assert (t.dtype, t.shape) == (DType.E8M0, (64, 2)) and "layers.0.wq.scale" not in p._names()
    assert validate(p, assign(p, 4)).ok
    packed = pack(p, assign(p, 4))
    i = p.buffer_id("layers.0.wq")
    assert int(packed.buffers[i]["scale"]) == -1
    assert int(packed.buffers[i]["block_scale"]) == p.buffer_id("layers.0.wq.block_scale")
    got = changed(p, "layers.0.wq.block_scale", shape=(64, 4))
    assert any("the e8m0 block exponents of buffer 'layers.0.wq'" in r and "expected a E8M0 WEIGHT of shape (64, 2)" in r
               for r in got), got
    bad = dict(w)
    bad["layers.1.wv.block_scale"] = w["layers.1.wv.block_scale"].clone()
    bad["layers.1.wv.block_scale"][3, 1] = 255
    with pytest.raises(UserError, match=r"layers\.1\.wv\.block_scale.*e8m0 block exponents of 'layers\.1\.wv'.*"
                                        r"NaN exponent 255 at \[3, 1\]"):
        ReferenceVM(packed, bad)


@pytest.mark.parametrize("name", ["llama-untied", "qwen3-qk-norm"])
def test_megavm_run_on_an_mxfp4_folder_matches_transformers(tmp_path, name, capsys):
    """`megavm quantize --format mxfp4` on a transformers checkpoint, then `megavm run --checkpoint`
    (ReferenceVM on the CPU): greedy tokens identical to transformers' own model class loaded with the
    weights the folder stands for, logits within 1e-4 of the largest (f32)."""
    from tests.hf_families import check_fp8_run
    check_fp8_run(name, tmp_path, "cpu", capsys, "mxfp4")


def test_bad_mxfp4_folders_are_named_and_wide_rows_run(tmp_path, capsys):
    """Bad folders are refused in one line; a row whose block exponents span 40 binades (refused while
    megavm held mxfp4 as e4m3 block scales under a row scale) runs."""
    from safetensors.torch import load_file, save_file

    from megavm import cli
    from tests.hf_families import check_folder_refusals

    q = check_folder_refusals(tmp_path, "mxfp4", [
        (lambda t: t["model.layers.1.self_attn.q_proj.weight_scales"].__setitem__((0, 1), 255),
         "model.layers.1.self_attn.q_proj.weight_scales holds the NaN exponent 255 at [0, 1]"),
        (lambda t: t.__setitem__("lm_head.weight_blocks", t["lm_head.weight_blocks"][:5]),
         "lm_head.weight_blocks: (5,"),
        (lambda t: t.__setitem__("model.layers.0.self_attn.o_proj.weight_scales",
                                 t["model.layers.0.self_attn.o_proj.weight_scales"].to(torch.int16)),
         "model.layers.0.self_attn.o_proj.weight_scales: dtype I16; an mxfp4 folder holds it as U8"),
    ], capsys)
    f = q / "model.safetensors"
    t = load_file(str(f))
    s = t["model.layers.0.mlp.down_proj.weight_scales"]
    s[3, 0] = int(s[3].max()) - 40
    t["model.layers.0.mlp.down_proj.weight_blocks"][3, 0] = 0x77     # codes 6: a live block 40 binades down
    save_file(t, str(f), metadata={"format": "pt"})
    assert cli.main(["run", "--checkpoint", str(q), "--tokens", "2", "--device", "cpu"]) == 0, capsys.readouterr()
