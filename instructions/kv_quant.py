"""KV_QUANT: the second of a quantized append's two dependent steps. Once every producer tile of the
new K (or V) row has written it to y and its partial amax (RMS_LINEAR_AMAX), it reduces the partials
to the row's amax over every KV head and appends KV head kv_head's rows at position pos:
- to an e4m3 cache, as codes e4m3(y / scale), scale = amax / 448 (at their swizzled places,
  instructions/kv_cache.py), the scale beside them in scale[kv_head, pos] (an all-zero row: scale 0,
  codes 0). A reader dequantizes code x scale.
- to an e2m1 (NVFP4) cache, as vLLM's reference NVFP4 quantizer does a tensor of that amax
  (core/codecs.py: nvfp4_rows): global = 448 x 6 / amax, an e4m3 scale per 16 elements in
  block_scale[kv_head, pos], codes e2m1(y / (block scale / global)), scale[kv_head, pos] = 1 / global.
  A reader dequantizes e2m1(code) x block scale x scale.
It must wait for every producer of amax: reading the partials before the last is written is the race
the validator refuses (a scale from part of the row, codes that saturate)."""
import torch

from megavm.core.types import DType
from megavm.instructions.attention import KV_HEAD
from megavm.instructions.kv_cache import columns
from megavm.instructions.spec import ACT, F32, I32, INP, KV, POSITION, Access, OpSpec, Slot, full, need
from megavm.core.codecs import nvfp4_rows

E4M3_MAX = 448.0


def quantize_row(y: torch.Tensor, amax: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(e4m3 codes of y, the f32 scale) for rows whose magnitude is at most amax (a scalar, or one per
    row broadcast against y): scale = amax / 448, codes = e4m3(y / scale) rounded to nearest even
    (vLLM's scaled_fp8_quant with a dynamic per-tensor scale); amax 0 gives scale 0 and zero codes."""
    # a division (as the kernel's __fdiv_rn and vLLM's kernel): on CUDA torch turns a tensor over a number
    # into the tensor times the number's reciprocal, one ulp off for some values
    scale = amax.float() / torch.full_like(amax, E4M3_MAX, dtype=torch.float32)
    live = scale > 0
    codes = torch.where(live, y.float() / torch.where(live, scale, torch.ones_like(scale)), torch.zeros_like(scale))
    return codes.to(torch.float8_e4m3fn), scale


def _block(outs):
    return outs[2] if len(outs) > 2 else None


def check(p, ins, outs):
    probs = []
    y, amax, pos = ins
    cache, scale = outs[:2]
    block = _block(outs)
    need(cache.dtype in (DType.F8E4M3, DType.E2M1), probs, f"cache is {cache.dtype.name}, expected F8E4M3 or E2M1 codes")
    need(len(cache.shape) == 3, probs, f"cache has shape {cache.shape}, expected (kv_heads, capacity, head_dim)")
    if probs:
        return probs
    nkv, cap, hd = cache.shape
    nvfp4 = cache.dtype == DType.E2M1
    need(nvfp4 == (block is not None), probs,
         f"an {cache.dtype.name} cache takes {'its block_scale' if nvfp4 else 'no block_scale'}")
    if nvfp4 and block is not None:
        need(block.dtype == DType.F8E4M3 and block.shape == (nkv, cap, hd // 16), probs,
             f"block_scale is {block.dtype.name} {block.shape}, expected F8E4M3 ({nkv}, {cap}, {hd // 16})")
        need(hd % 32 == 0, probs, f"head_dim={hd} of e2m1 rows must be a multiple of 32 (16-byte rows of codes)")
    need(scale.shape == (nkv, cap), probs, f"scale has shape {scale.shape}, expected ({nkv}, {cap})")
    need(y.shape == (nkv * hd,), probs, f"y has shape {y.shape}, expected ({nkv * hd},)")
    need(len(amax.shape) == 1 and amax.shape[0] >= 1, probs, f"amax has shape {amax.shape}, expected (tiles,)")
    need(pos.shape == (1,), probs, f"pos has shape {pos.shape}, expected (1,)")
    need(0 <= p["kv_head"] < nkv, probs, f"kv_head={p['kv_head']} outside {nkv} KV heads")
    need(hd % 16 == 0, probs, f"head_dim={hd} must be a multiple of 16 (16-byte rows of codes)")
    return probs


def accesses(p, ins, outs):
    h, (_, cap, hd) = p["kv_head"], outs[0].shape
    return [Access("in", 0, ((h * hd, (h + 1) * hd),)), Access("in", 1, full(ins[1].shape)),
            Access("in", 2, full(ins[2].shape)),
            Access("out", 0, ((h, h + 1), (0, cap), (0, hd))), Access("out", 1, ((h, h + 1), (0, cap)))] + (
        [Access("out", 2, ((h, h + 1), (0, cap), (0, hd // 16)))] if _block(outs) is not None else [])


def cost(hd: int, partials: int, nvfp4: bool) -> tuple[int, int]:
    """(bytes, flops): the row and the amax partials read, the codes and scales written (e2m1: half a byte
    an element and an e4m3 scale per 16)."""
    written = (hd // 2 + hd // 16 if nvfp4 else hd) + 4
    return 4 * hd + 4 * partials + written, 3 * hd


def reference(p, ins, outs):
    y, amax, pos = ins
    cache, scale = outs[:2]
    block = _block(outs)
    t, h = int(pos[0]), p["kv_head"]
    if not 0 <= t < cache.shape[1]:
        raise ValueError(f"KV_QUANT: position {t} outside KV capacity {cache.shape[1]}")
    if block is not None:                                       # e2m1: bytes [kv_heads, capacity, head_dim / 2]
        hd = 2 * cache.shape[2]
        cache[h, t], block[h, t], scale[h, t] = nvfp4_rows(y[h * hd:(h + 1) * hd], amax.max())
        return
    hd = cache.shape[2]
    codes, s = quantize_row(y[h * hd:(h + 1) * hd], amax.max())
    e = torch.arange(hd, device=cache.device)
    cache[h, t, columns(cache, torch.tensor(t, device=cache.device), e)] = codes        # swizzled (kv_cache.py)
    scale[h, t] = s


SPEC = OpSpec(
    name="KV_QUANT", code=22, doc=__doc__,
    inputs=(Slot("y", ACT, F32), Slot("amax", ACT, F32), Slot("pos", INP, I32, role=POSITION, bound=("cache", 1))),
    outputs=(Slot("cache", KV, (DType.F8E4M3, DType.E2M1)), Slot("scale", KV, F32),
             Slot("block_scale", KV, (DType.F8E4M3,), optional=True)),
    params=(KV_HEAD,),
    check=check, accesses=accesses, reference=reference,
    shared=lambda p, ins, outs: 0,                 # the row and its amax read from memory, quantized in registers
    cost=lambda p, ins, outs: cost(outs[0].shape[2], ins[1].shape[0], _block(outs) is not None),
)
