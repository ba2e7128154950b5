"""Weight formats for quantized checkpoints: quantize (codes and scales, exactly as each format
defines them) and dequantize, in the tensor layouts of the checkpoints that use them.

| format | values | scales | layout (per weight `<p>.weight` [out, in]) |
|---|---|---|---|
| fp8 | e4m3 | f32 per output row, amax / 448 | `weight` F8_E4M3 [out, in], `weight_scale` F32 [out, 1] |
| fp8-block | e4m3 | f32 per 128x128 block, amax / 448 | `weight` F8_E4M3, `weight_scale_inv` F32 [ceil(out/128), ceil(in/128)] (the Hugging Face "fp8" format) |
| nvfp4 | e2m1 | e4m3 per 16 inputs, and one f32 global scale | `weight` U8 [out, in/2] (element 2i in the low nibble), `weight_scale` F8_E4M3 [out, in/16], `weight_scale_2` F32 [] (ModelOpt) |
| mxfp4 | e2m1 | a power of two (e8m0) per 32 inputs | `weight_blocks` U8 [out, in/32, 16], `weight_scales` U8 [out, in/32] (biased exponent) |
| int4 | 4-bit with zero points, group 128 | f16 per group and output | `qweight` I32 [in, out/8], `qzeros` I32 [in/128, out/8], `scales` F16 [in/128, out] (AWQ GEMM packing) |

Definitions where a format leaves room:
- e2m1 rounding is to nearest, ties to the even code, saturating at 6; whatever rounds to 0 (from
  either side) is code 0, never -0.
- nvfp4 follows the reference quantizer of vLLM: global scale 448 * 6 / amax, block scale
  e4m3(global * block amax / 6), values x * (1 / (block scale / global)). An all-zero tensor has
  global scale 1 (weight_scale_2 1); an all-zero block has scale 0 and codes 0.
- mxfp4: the block's exponent is floor(log2(amax)) - 2 (e2m1's largest exponent), within
  [-127, 127]; an all-zero block has exponent -127 and codes 0.
- fp8: an all-zero row or block has scale 0 and codes 0 (dequantized 0, never NaN).
- int4 (AutoAWQ's formula): scale max(max - min, 1e-5) / 15, stored as f16 and used as stored; zero
  -round(min / scale) in [0, 15]; q = clamp(round(w / scale) + zero, 0, 15); packed 8 to an int32 in
  the order 0, 2, 4, 6, 1, 3, 5, 7.
"""
from __future__ import annotations

import torch

from megavm.core.codecs import (E2M1_GRID, E4M3_MAX, e2m1_codes, e2m1_values, e4m3, nvfp4_rows,  # noqa: F401
                                 nvfp4_values, pack_nibbles, recip, unpack_nibbles)
from megavm.core.errors import CheckpointError

FORMATS = ("fp8", "fp8-block", "nvfp4", "mxfp4", "int4")
# the tensors of one quantized weight, by suffix; the second is always a scale, found only beside a weight
PARTS = {"fp8": ("weight", "weight_scale"), "fp8-block": ("weight", "weight_scale_inv"),
         "nvfp4": ("weight", "weight_scale", "weight_scale_2"), "mxfp4": ("weight_blocks", "weight_scales"),
         "int4": ("qweight", "qzeros", "scales")}
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)       # nibble j of a packed int32 holds column AWQ_ORDER[j] of its 8


def e4m3_nan(codes: torch.Tensor) -> list[int] | None:
    """The index of the first NaN code (0x7f or 0xff) of an e4m3 tensor, or None."""
    nan = (codes.view(torch.uint8) & 0x7F) == 0x7F
    return nan.nonzero()[0].tolist() if bool(nan.any()) else None


def _blocks(w: torch.Tensor, n: int, fmt: str) -> torch.Tensor:
    out, k = w.shape
    if k % n:
        raise CheckpointError(f"{fmt}: the input size {k} is not a multiple of the block of {n}")
    return w.float().reshape(out, k // n, n)


# ---- the formats ----------------------------------------------------------------------------------
def quantize(w: torch.Tensor, fmt: str) -> dict[str, torch.Tensor]:
    """One [out, in] weight -> its tensors in the format's layout, by suffix (`weight`, `weight_scale`, ...)."""
    if w.ndim != 2:
        raise CheckpointError(f"{fmt}: a weight must be a matrix, not shape {tuple(w.shape)}")
    if not torch.isfinite(w).all():
        raise CheckpointError(f"{fmt}: the weight holds NaN or inf")
    w = w.float()
    out, k = w.shape
    if fmt == "fp8":
        s = w.abs().amax(1, keepdim=True) / E4M3_MAX
        return {"weight": e4m3(w * recip(s)), "weight_scale": s}
    if fmt == "fp8-block":
        po, pk = -out % 128, -k % 128
        b = torch.nn.functional.pad(w, (0, pk, 0, po)).reshape((out + po) // 128, 128, (k + pk) // 128, 128)
        s = b.abs().amax((1, 3)) / E4M3_MAX
        q = (b * recip(s)[:, None, :, None]).reshape(out + po, k + pk)[:out, :k]
        return {"weight": e4m3(q), "weight_scale_inv": s}
    if fmt == "nvfp4":
        _blocks(w, 16, fmt)                        # refuses an input size that is not whole blocks
        codes, bs, s = nvfp4_rows(w, w.abs().max())
        return {"weight": codes, "weight_scale": bs, "weight_scale_2": s}
    if fmt == "mxfp4":
        b = _blocks(w, 32, fmt)
        amax = b.abs().amax(-1)
        e = torch.where(amax > 0, torch.floor(torch.log2(torch.where(amax > 0, amax, torch.ones_like(amax)))) - 2,
                        torch.full_like(amax, -127.0)).clamp(-127, 127)
        codes = e2m1_codes((b / torch.exp2(e).unsqueeze(-1)).clamp(-6.0, 6.0))
        return {"weight_blocks": pack_nibbles(codes), "weight_scales": (e + 127).to(torch.uint8)}
    if fmt == "int4":
        if k % 128 or out % 8:
            raise CheckpointError(f"int4: shape {tuple(w.shape)} needs inputs in groups of 128 and outputs in 8s")
        g = w.t().reshape(k // 128, 128, out)                       # [groups, 128, out]
        hi, lo = g.amax(1), g.amin(1)
        s = ((hi - lo).clamp_min(1e-5) / 15).half()
        z = (-torch.round(lo / s.float())).clamp(0, 15)
        q = (torch.round(g / s.float().unsqueeze(1)) + z.unsqueeze(1)).clamp(0, 15).to(torch.int32).reshape(k, out)
        return {"qweight": pack_awq(q), "qzeros": pack_awq(z.to(torch.int32)), "scales": s}
    raise CheckpointError(f"format {fmt!r} is not one of {', '.join(FORMATS)}")


def pack_awq(q: torch.Tensor) -> torch.Tensor:
    """[rows, cols] values in [0, 15] -> [rows, cols / 8] int32, 8 to a word in AWQ's order."""
    r, c = q.shape
    q = q.to(torch.int64).reshape(r, c // 8, 8)[..., list(AWQ_ORDER)]
    word = sum(q[..., j] << (4 * j) for j in range(8))
    return torch.where(word >= 1 << 31, word - (1 << 32), word).to(torch.int32)


def unpack_awq(packed: torch.Tensor) -> torch.Tensor:
    p = packed.to(torch.int64) & 0xFFFFFFFF
    nib = torch.stack([(p >> (4 * j)) & 15 for j in range(8)], dim=-1)      # nibble j -> column AWQ_ORDER[j]
    inv = [AWQ_ORDER.index(c) for c in range(8)]
    return nib[..., inv].reshape(p.shape[0], -1).to(torch.int32)


def dequantize(t: dict[str, torch.Tensor], fmt: str) -> torch.Tensor:
    """The [out, in] f32 weight a format's tensors stand for."""
    if fmt == "fp8":
        return t["weight"].float() * t["weight_scale"].float()
    if fmt == "fp8-block":
        q = t["weight"].float()
        s = t["weight_scale_inv"].float().repeat_interleave(128, 0).repeat_interleave(128, 1)
        return q * s[:q.shape[0], :q.shape[1]]
    if fmt == "nvfp4":
        return nvfp4_values(t["weight"], t["weight_scale"], t["weight_scale_2"])
    if fmt == "mxfp4":
        v = e2m1_values(unpack_nibbles(t["weight_blocks"]))                # [out, in/32, 32]
        return (v * torch.exp2(t["weight_scales"].float() - 127).unsqueeze(-1)).flatten(-2)
    if fmt == "int4":
        q, z = unpack_awq(t["qweight"]).float(), unpack_awq(t["qzeros"]).float()
        s = t["scales"].float()
        return ((q - z.repeat_interleave(128, 0)) * s.repeat_interleave(128, 0)).t().contiguous()
    raise CheckpointError(f"format {fmt!r} is not one of {', '.join(FORMATS)}")


def config_entry(fmt: str) -> dict:
    """config.json's quantization_config for a format (the loaders that read each layout expect it)."""
    return {"fp8": {"quant_method": "fp8", "weight_block_size": None, "activation_scheme": "dynamic",
                    "megavm_format": "fp8"},
            "fp8-block": {"quant_method": "fp8", "weight_block_size": [128, 128], "activation_scheme": "dynamic",
                          "megavm_format": "fp8-block"},
            "nvfp4": {"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16, "megavm_format": "nvfp4"},
            "mxfp4": {"quant_method": "mxfp4", "megavm_format": "mxfp4"},
            "int4": {"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True, "version": "gemm",
                     "megavm_format": "int4"}}[fmt]
