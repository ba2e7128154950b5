"""The 4- and 8-bit value codes megavm stores (NVFP4 and FP8 weights and KV caches), as tensors:
e2m1 codes and their nibble packing, e4m3 rounding, and the NVFP4 quantizer of vLLM's reference
(schedule/quant.py writes checkpoints with them, instructions/kv_quant.py appends KV rows).

- e2m1 rounding is to nearest, ties to the even code, saturating at 6; whatever rounds to 0 (from
  either side) is code 0, never -0.
- nvfp4: global scale 448 * 6 / amax, block scale e4m3(global * block amax / 6), values
  x * (1 / (block scale / global)). An all-zero tensor has global scale 1; an all-zero block has scale
  0 and codes 0. A tensor whose amax is below 2688 / FLT_MAX (about 8e-36) has an infinite global
  scale: its scale 1 / global is 0 and it reads back as zeros, never NaN.
"""
from __future__ import annotations

import torch

E4M3_MAX = 448.0
E2M1_GRID = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
_E2M1_MID = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)     # between neighbouring grid values


def e2m1_codes(x: torch.Tensor) -> torch.Tensor:
    """4-bit codes (sign in bit 3) of f32 values: nearest grid value, ties to the even code, |x| > 6 -> 6.
    Comparisons with numbers only (no constant tensor to copy to the device), so a CUDA graph or
    torch.compile can hold it (flywheel/peers.py)."""
    mag = x.abs().float()
    idx = torch.zeros_like(mag, dtype=torch.uint8)
    for k, m in enumerate(_E2M1_MID, 1):       # past midpoint k: code k or more; at it, the even one of k - 1, k
        idx += (mag >= m if k % 2 == 0 else mag > m).to(torch.uint8)
    return idx | (((x < 0) & (idx > 0)).to(torch.uint8) << 3)          # what rounds to 0 is +0


def e2m1_values(codes: torch.Tensor) -> torch.Tensor:
    v = E2M1_GRID.to(codes.device)[(codes & 7).long()]
    return torch.where((codes & 8) != 0, -v, v)


def pack_nibbles(codes: torch.Tensor) -> torch.Tensor:
    """[..., 2n] codes -> [..., n] bytes, element 2i in the low nibble."""
    return codes[..., 0::2] | (codes[..., 1::2] << 4)


def unpack_nibbles(packed: torch.Tensor) -> torch.Tensor:
    return torch.stack([packed & 15, packed >> 4], dim=-1).flatten(-2)


def recip(x: torch.Tensor) -> torch.Tensor:
    return torch.where(x == 0, torch.zeros_like(x), 1.0 / torch.where(x == 0, torch.ones_like(x), x))


def e4m3(x: torch.Tensor) -> torch.Tensor:
    return x.clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)


def nvfp4_rows(y: torch.Tensor, amax: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Rows y [..., n] (n a multiple of 16) against the amax of the tensor they belong to (a scalar):
    (packed e2m1 codes [..., n / 2] uint8, e4m3 block scales [..., n / 16], the f32 scale 1 / global).
    vLLM's reference NVFP4 quantizer: global = 448 x 6 / amax (1 for amax 0), block scale
    e4m3(global x block amax / 6), codes e2m1(x / (block scale / global)) rounded to nearest even;
    element k of a row dequantizes to e2m1(code) x block_scale[k // 16] x scale."""
    amax = amax.float()
    g = torch.where(amax > 0, (E4M3_MAX * 6.0) / torch.where(amax > 0, amax, torch.ones_like(amax)),
                    torch.ones_like(amax))
    b = y.float().reshape(*y.shape[:-1], y.shape[-1] // 16, 16)
    m = b.abs().amax(-1)
    bs = e4m3(torch.where(m > 0, g * (m * (1.0 / 6.0)), torch.zeros_like(m)))   # an all-zero block: 0, even if g is inf
    scaled = (b * recip(bs.float() * recip(g)).unsqueeze(-1)).clamp(-6.0, 6.0)
    return pack_nibbles(e2m1_codes(scaled).reshape(y.shape)), bs, (1.0 / g).reshape(())


def nvfp4_values(codes: torch.Tensor, block_scale: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """What nvfp4_rows' (codes [..., n / 2], block scales [..., n / 16], scale broadcast against [..., n]:
    a scalar or [..., 1]) stand for: f32 [..., n]."""
    v = e2m1_values(unpack_nibbles(codes))
    v = v.reshape(*v.shape[:-1], v.shape[-1] // 16, 16) * block_scale.float().unsqueeze(-1)
    return v.flatten(-2) * scale.float()
