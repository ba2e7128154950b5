"""KV_QUANT: the second of a quantized append's two dependent steps. Once every producer tile of the
new K (or V) row has written it to y and its partial amax (RMS_LINEAR_AMAX), it reduces the partials
to the row's amax over every KV head, takes the scale amax / 448 and appends KV head kv_head's rows to
an e4m3 cache at position pos as codes e4m3(y / scale) (at their swizzled places, instructions/
kv_cache.py), the scale beside them in scale[kv_head, pos]
(an all-zero row: scale 0, codes 0). A reader dequantizes code x scale. It must wait for every
producer of amax: reading the partials before the last is written is the race the validator refuses
(a scale from part of the row, codes that saturate)."""
import torch

from megavm.core.types import DType
from megavm.instructions.attention import KV_HEAD
from megavm.instructions.kv_cache import columns
from megavm.instructions.spec import ACT, F32, I32, INP, KV, POSITION, Access, OpSpec, Slot, full, need

E4M3_MAX = 448.0


def quantize_row(y: torch.Tensor, amax: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(e4m3 codes of y, the f32 scale) for rows whose magnitude is at most amax (a scalar, or one per
    row broadcast against y): scale = amax / 448, codes = e4m3(y / scale) rounded to nearest even
    (vLLM's scaled_fp8_quant with a dynamic per-tensor scale); amax 0 gives scale 0 and zero codes."""
    scale = amax.float() / E4M3_MAX
    live = scale > 0
    codes = torch.where(live, y.float() / torch.where(live, scale, torch.ones_like(scale)), torch.zeros_like(scale))
    return codes.to(torch.float8_e4m3fn), scale


def check(p, ins, outs):
    probs = []
    y, amax, pos = ins
    cache, scale = outs
    need(cache.dtype == DType.F8E4M3, probs, f"cache is {cache.dtype.name}, expected F8E4M3 codes")
    need(len(cache.shape) == 3, probs, f"cache has shape {cache.shape}, expected (kv_heads, capacity, head_dim)")
    if probs:
        return probs
    nkv, cap, hd = cache.shape
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
            Access("out", 0, ((h, h + 1), (0, cap), (0, hd))), Access("out", 1, ((h, h + 1), (0, cap)))]


def reference(p, ins, outs):
    y, amax, pos = ins
    cache, scale = outs
    t, h, hd = int(pos[0]), p["kv_head"], cache.shape[2]
    if not 0 <= t < cache.shape[1]:
        raise ValueError(f"KV_QUANT: position {t} outside KV capacity {cache.shape[1]}")
    codes, s = quantize_row(y[h * hd:(h + 1) * hd], amax.max())
    e = torch.arange(hd, device=cache.device)
    cache[h, t, columns(cache, torch.tensor(t, device=cache.device), e)] = codes        # swizzled (kv_cache.py)
    scale[h, t] = s


SPEC = OpSpec(
    name="KV_QUANT", code=22, doc=__doc__,
    inputs=(Slot("y", ACT, F32), Slot("amax", ACT, F32), Slot("pos", INP, I32, role=POSITION, bound=("cache", 1))),
    outputs=(Slot("cache", KV, (DType.F8E4M3,)), Slot("scale", KV, F32)),
    params=(KV_HEAD,),
    check=check, accesses=accesses, reference=reference,
    cost=lambda p, ins, outs: (4 * outs[0].shape[2] + 4 * ins[1].shape[0] + outs[0].shape[2], 2 * outs[0].shape[2]),
)
