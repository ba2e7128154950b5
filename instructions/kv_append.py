"""RMS_LINEAR_KV: a key or value projection tile whose epilogue (RoPE for keys) appends to the KV cache.

Row r of w is element r % head_dim of KV head r // head_dim; the result lands in cache[head, pos, d].
"""
import torch

from instructions.common import matvec, rms_normed, tile_cost
from instructions.rms_linear import check_norm_linear, row_stream
from instructions.rope import rotate_pairs
from instructions.spec import ACT, INP, KV, W, Access, Op, OpSpec, Slot, full, need
from schedule.ir import DType


def check(p, ins, outs):
    probs = check_norm_linear(p, ins[:3], outs)
    hd = p["head_dim"]
    cache = tuple(outs[0])
    need(len(cache) == 3 and cache[2] == hd, probs, f"cache has shape {cache}, expected (kv_heads, capacity, {hd})")
    if len(cache) == 3 and len(ins[2]) == 2:
        need(ins[2][0] == cache[0] * hd, probs, f"w has {ins[2][0]} rows, cache holds {cache[0]}x{hd}")
    need(p["rope"] in (0, 1), probs, f"rope={p['rope']} must be 0 or 1")
    if p["rope"]:
        need(hd % 2 == 0, probs, f"head_dim={hd} must be even for RoPE")
        need(p["row0"] % 2 == 0 and p["nrows"] % 2 == 0, probs, "RoPE tiles must hold whole row pairs")
    need(tuple(ins[3]) == (1,), probs, f"pos has shape {tuple(ins[3])}, expected (1,)")
    need(tuple(ins[4]) == (hd // 2,), probs, f"freqs has shape {tuple(ins[4])}, expected ({hd // 2},)")
    return probs


def accesses(p, ins, outs):
    hd = p["head_dim"]
    r0, r1 = p["row0"], p["row0"] + p["nrows"]
    h0, h1 = r0 // hd, (r1 - 1) // hd + 1
    # a tile inside one head writes a column range; one spanning heads writes them whole
    cols = (r0 % hd, (r1 - 1) % hd + 1) if h1 - h0 == 1 else (0, hd)
    return [Access("in", 0, full(ins[0])), Access("in", 1, full(ins[1])),
            Access("in", 2, ((r0, r1), (0, ins[2][1]))), Access("in", 3, full(ins[3])),
            Access("in", 4, full(ins[4])), Access("out", 0, ((h0, h1), (0, outs[0][1]), cols))]


def reference(p, ins, outs):
    x, g, w, pos, freqs = ins
    hd, r0, r1 = p["head_dim"], p["row0"], p["row0"] + p["nrows"]
    t = int(pos[0])
    cache = outs[0]
    if not 0 <= t < cache.shape[1]:
        raise ValueError(f"RMS_LINEAR_KV: position {t} outside KV capacity {cache.shape[1]}")
    y = matvec(w[r0:r1], rms_normed(x, g, p["eps"]))
    if p["rope"]:
        y = rotate_pairs(y, r0, hd, t, freqs)
    r = torch.arange(r0, r1, device=cache.device)
    cache[r // hd, t, r % hd] = y.to(cache.dtype)


SPEC = OpSpec(
    op=Op.RMS_LINEAR_KV,
    inputs=(Slot("x", ACT, (DType.F32,)), Slot("gamma", W), Slot("w", W), Slot("pos", INP, (DType.I32,)),
            Slot("freqs", W, (DType.F32,))),
    outputs=(Slot("cache", KV),),
    params=("row0", "nrows", "eps", "head_dim", "rope"), float_params=frozenset({"eps"}),
    check=check, accesses=accesses, reference=reference, streams=row_stream,
    cost=lambda p, ins, isz: tile_cost(p, ins[2][1], isz[2]),
)
