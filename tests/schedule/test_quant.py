"""The weight formats (schedule/quant.py) against oracles written here from the formats' published
definitions, not from our code:
- nvfp4: vLLM's reference quantizer (tests/kernels/quantization/nvfp4_utils.py: ref_nvfp4_quant and
  cast_to_fp4: global scale 448*6/amax, block scale e4m3(global * block amax / 6), the e2m1 bins);
- mxfp4: the OCP Microscaling Formats spec v1.0, section 6.3 (shared exponent floor(log2(amax)) - 2);
- fp8: e4m3 from torch's own float8_e4m3fn conversion, scales amax / 448 (per row; per 128x128 block
  as the Hugging Face "fp8" format's weight_scale_inv);
- int4: AutoAWQ's pseudo_quantize_tensor and its pack order 0, 2, 4, 6, 1, 3, 5, 7.
Codes and scales are compared exactly; dequantized weights exactly against codes x scales."""
import json
import math

import pytest
import torch

from megavm.schedule import quant

pytest.importorskip("safetensors")


def _fp4_bins(x: torch.Tensor) -> torch.Tensor:
    """vLLM's cast_to_fp4: magnitudes onto the e2m1 values by its bins (ties to even)."""
    s, m = torch.sign(x), x.abs()
    out = torch.zeros_like(m)
    for lo, hi, v, lo_in, hi_in in [(0.25, 0.75, 0.5, False, False), (0.75, 1.25, 1.0, True, True),
                                    (1.25, 1.75, 1.5, False, False), (1.75, 2.5, 2.0, True, True),
                                    (2.5, 3.5, 3.0, False, False), (3.5, 5.0, 4.0, True, True)]:
        sel = ((m >= lo) if lo_in else (m > lo)) & ((m <= hi) if hi_in else (m < hi))
        out[sel] = v
    out[m > 5.0] = 6.0
    return out * s


def _ref_nvfp4(x: torch.Tensor):
    amax = x.abs().max().float()
    g = (448.0 * 6.0) / amax
    b = x.float().reshape(x.shape[0], -1, 16)
    vec_max = b.abs().amax(-1, keepdim=True)
    recip6 = torch.tensor(1 / 6.0)
    scale = (g * (vec_max * recip6)).clamp(max=448.0).to(torch.float8_e4m3fn).float()
    rec = lambda t: torch.where(t == 0, torch.zeros_like(t), 1.0 / t)  # noqa: E731
    out_scale = rec(scale * rec(g))
    return _fp4_bins((b * out_scale).clamp(-6, 6)).reshape(x.shape), scale.squeeze(-1), g


def _weights(seed, out=64, k=256):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(out, k, generator=g) * torch.exp(torch.randn(out, 1, generator=g))
    w[3, :32] = 0                                             # an all-zero block (nvfp4 and mxfp4)
    w[5, 32:64] = torch.randn(32, generator=g) * 1e-39        # a subnormal block
    # values exactly on e2m1 midpoints relative to their block's scale (ties)
    w[7, 64:80] = torch.tensor([6.0, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -0.25, -0.75, -1.25, -1.75, -2.5, -3.5,
                                -5.0, -6.0])
    return w


def test_e2m1_rounds_to_nearest_even_as_vllm_bins():
    x = torch.cat([torch.linspace(-7, 7, 2801), torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -0.0, 0.0])])
    torch.testing.assert_close(quant.e2m1_values(quant.e2m1_codes(x)), _fp4_bins(x.clamp(-6, 6)), rtol=0, atol=0)
    assert quant.e2m1_codes(torch.tensor([-0.0])).item() == 0


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_nvfp4_codes_and_scales_are_vllms(seed):
    w = _weights(seed)
    t = quant.quantize(w, "nvfp4")
    want_vals, want_scale, g = _ref_nvfp4(w)
    got_vals = quant.e2m1_values(quant.unpack_nibbles(t["weight"]))
    assert torch.equal(got_vals, want_vals)
    assert torch.equal(t["weight_scale"].float(), want_scale)
    assert t["weight_scale_2"].item() == (1.0 / g).item()
    # element 2i in the low nibble
    codes = quant.e2m1_codes(want_vals)
    assert torch.equal(t["weight"], (codes[:, 0::2] | (codes[:, 1::2] << 4)).to(torch.uint8))
    assert torch.equal(t["weight_scale"][3, :2].float(), torch.zeros(2)), "an all-zero block has scale 0"
    d = quant.dequantize(t, "nvfp4")
    assert torch.isfinite(d).all() and torch.equal(d[3, :32], torch.zeros(32))


def test_nvfp4_all_zero_tensor_is_defined():
    t = quant.quantize(torch.zeros(8, 32), "nvfp4")
    assert t["weight_scale_2"].item() == 1.0 and not t["weight"].any() and not t["weight_scale"].float().any()
    assert torch.equal(quant.dequantize(t, "nvfp4"), torch.zeros(8, 32))


@pytest.mark.parametrize("seed", [0, 1])
def test_mxfp4_is_the_ocp_spec(seed):
    w = _weights(seed)
    t = quant.quantize(w, "mxfp4")
    for r in range(w.shape[0]):
        for b in range(w.shape[1] // 32):
            blk = w[r, 32 * b:32 * b + 32]
            amax = blk.abs().max().item()
            e = max(-127, min(127, math.floor(math.log2(amax)) - 2)) if amax > 0 else -127
            assert t["weight_scales"][r, b].item() == e + 127, (r, b)
            want = _fp4_bins((blk / 2.0 ** e).clamp(-6, 6))
            got = quant.e2m1_values(quant.unpack_nibbles(t["weight_blocks"][r, b]))
            assert torch.equal(got, want), (r, b)
    d = quant.dequantize(t, "mxfp4")
    assert torch.isfinite(d).all() and torch.equal(d[3, :32], torch.zeros(32))


def test_fp8_per_row_and_per_block():
    w = _weights(4, out=200, k=300)
    w[9] = 0
    t = quant.quantize(w, "fp8")
    s = w.abs().amax(1, keepdim=True) / 448.0
    assert torch.equal(t["weight_scale"], s)
    nz = s.squeeze(1) > 0
    assert torch.equal(t["weight"][nz].float(), (w[nz] / s[nz]).to(torch.float8_e4m3fn).float())
    assert not t["weight"][9].float().any() and torch.isfinite(quant.dequantize(t, "fp8")).all()
    t = quant.quantize(w, "fp8-block")
    assert t["weight_scale_inv"].shape == (2, 3)
    for i in range(2):
        for j in range(3):
            blk = w[128 * i:128 * i + 128, 128 * j:128 * j + 128]
            s = blk.abs().max() / 448.0
            assert t["weight_scale_inv"][i, j] == s
            q = t["weight"][128 * i:128 * i + 128, 128 * j:128 * j + 128].float()
            assert torch.equal(q, (blk / s).to(torch.float8_e4m3fn).float())
    d = quant.dequantize(t, "fp8-block")
    s = t["weight_scale_inv"].repeat_interleave(128, 0).repeat_interleave(128, 1)[:200, :300]
    # e4m3: 3 mantissa bits (half an ulp: 2^-4 relative), subnormals down to 2^-9 of the block's scale
    assert bool(((d - w).abs() <= 2 ** -4 * w.abs() + s * 2 ** -10).all())


def _awq_pack(q):
    """AutoAWQ's packing: for each int32, column order[j] of the 8 goes to bits 4j."""
    rows, cols = q.shape
    out = torch.zeros(rows, cols // 8, dtype=torch.int64)
    for c in range(cols // 8):
        for j, col in enumerate((0, 2, 4, 6, 1, 3, 5, 7)):
            out[:, c] |= q[:, 8 * c + col].to(torch.int64) << (4 * j)
    return torch.where(out >= 2 ** 31, out - 2 ** 32, out).to(torch.int32)


def test_int4_is_autoawqs_formula_and_packing():
    g = torch.Generator().manual_seed(6)
    w = torch.randn(16, 256, generator=g)                 # [out, in]
    w[2, :128] = 0.5                                      # a constant group: max - min = 0 -> the 1e-5 floor
    t = quant.quantize(w, "int4")
    wt = w.t().reshape(2, 128, 16)                        # AWQ groups the input axis of W^T [in, out]
    mx, mn = wt.amax(1, keepdim=True), wt.amin(1, keepdim=True)
    scales = ((mx - mn).clamp(min=1e-5) / 15).half().float()
    zeros = (-torch.round(mn / scales)).clamp(0, 15)
    q = (torch.round(wt / scales) + zeros).clamp(0, 15).reshape(256, 16).to(torch.int32)
    assert torch.equal(t["scales"].float(), scales.squeeze(1))
    assert torch.equal(t["qweight"], _awq_pack(q))
    assert torch.equal(t["qzeros"], _awq_pack(zeros.squeeze(1).to(torch.int32)))
    d = quant.dequantize(t, "int4")
    want = ((q.reshape(2, 128, 16).float() - zeros) * scales).reshape(256, 16).t()
    assert torch.equal(d, want)


@pytest.mark.parametrize("fmt", quant.FORMATS)
def test_each_format_writes_exactly_its_parts(fmt):
    assert set(quant.quantize(torch.randn(128, 256), fmt)) == set(quant.PARTS[fmt])


def test_bad_shapes_and_values_are_named():
    from megavm.core.errors import CheckpointError
    with pytest.raises(CheckpointError, match="input size 20 is not a multiple of the block of 16"):
        quant.quantize(torch.ones(4, 20), "nvfp4")
    with pytest.raises(CheckpointError, match="NaN or inf"):
        quant.quantize(torch.tensor([[1.0, float("nan")] * 16]), "mxfp4")
    with pytest.raises(CheckpointError, match="groups of 128"):
        quant.quantize(torch.ones(8, 100), "int4")


def _llama_128(path):
    import shutil

    import transformers
    shutil.rmtree(path)
    torch.manual_seed(3)
    cfg = transformers.LlamaConfig(hidden_size=128, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
                                   intermediate_size=256, vocab_size=304, tie_word_embeddings=True)
    transformers.LlamaForCausalLM(cfg).save_pretrained(path, safe_serialization=True)


@pytest.mark.parametrize("fmt", quant.FORMATS)
def test_quantize_command_writes_a_folder_that_dequantizes_and_run_takes_it(tmp_path, fmt, capsys):
    """`megavm quantize` on a transformers checkpoint: every projection and the LM head (the tied
    head made its own) in the format, the rest unchanged, config.json marked; read back, each weight
    dequantizes to exactly what its codes and scales say; `megavm run` runs the folder."""
    from safetensors.torch import load_file

    from megavm import cli
    from megavm.quantize_cli import dequantized
    from tests.hf_families import save
    save("qwen3-qk-norm", tmp_path / "src")        # tied embeddings; hidden 64
    if fmt == "int4":                              # int4 groups inputs by 128: refused here, by tensor name
        assert cli.main(["quantize", "--checkpoint", str(tmp_path / "src"), "--format", fmt, "--out",
                         str(tmp_path / "bad")]) == 2
        assert "q_proj.weight: int4: shape (128, 64) needs inputs in groups of 128" in capsys.readouterr().err
        _llama_128(tmp_path / "src")
    src = load_file(str(tmp_path / "src" / "model.safetensors"))
    assert cli.main(["quantize", "--checkpoint", str(tmp_path / "src"), "--format", fmt, "--out",
                     str(tmp_path / "q")]) == 0
    cfg = json.loads((tmp_path / "q" / "config.json").read_text())
    assert cfg["quantization_config"]["megavm_format"] == fmt and cfg["tie_word_embeddings"] is False
    d = dequantized(tmp_path / "q")
    for name, w in src.items():
        proj = name == "model.embed_tokens.weight" or name.split(".")[-2].endswith("proj")
        if name.endswith("proj.weight"):
            assert torch.equal(d[name], quant.dequantize(quant.quantize(w, fmt), fmt)), name
        elif not proj or name == "model.embed_tokens.weight":
            assert torch.equal(d[name], w.float()), name
    assert torch.equal(d["lm_head.weight"], quant.dequantize(quant.quantize(src["model.embed_tokens.weight"], fmt), fmt))
    capsys.readouterr()
    # run: test_{fp8,fp8_block,nvfp4,mxfp4,int4}_weights.py hold it to transformers
    assert cli.main(["run", "--checkpoint", str(tmp_path / "q"), "--tokens", "2", "--device", "cpu"]) == 0
    assert cli.main(["quantize", "--checkpoint", str(tmp_path / "src"), "--format", fmt, "--out",
                     str(tmp_path / "q")]) == 2, "an existing, non-empty --out is refused"
