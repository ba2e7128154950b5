"""RMS_LINEAR_KV: a key or value projection tile whose epilogue (RoPE for keys) appends to the KV cache.

Row r of w is element r % head_dim of KV head r // head_dim; the result lands in cache[head, pos, d].

KV_APPEND (rows of a vector, RoPE for keys, into the cache) is the unfused form, for the RoPE/KV-fusion
ablation: the projection writes a plain vector and a KV_APPEND task appends it.
"""
import torch

from instructions.common import matvec, norm_input, tile_cost
from instructions.rms_linear import check_norm_linear, row_stream
from instructions.rope import check_vec_op, rotate_pairs
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


def cache_box(p, cache_shape):
    """The cache region rows [row0, row0 + nrows) append to (every position: pos is a runtime input)."""
    hd = p["head_dim"]
    r0, r1 = p["row0"], p["row0"] + p["nrows"]
    h0, h1 = r0 // hd, (r1 - 1) // hd + 1
    # a tile inside one head writes a column range; one spanning heads writes them whole
    cols = (r0 % hd, (r1 - 1) % hd + 1) if h1 - h0 == 1 else (0, hd)
    return ((h0, h1), (0, cache_shape[1]), cols)


def accesses(p, ins, outs):
    r0, r1 = p["row0"], p["row0"] + p["nrows"]
    return [Access("in", 0, full(ins[0])), Access("in", 1, full(ins[1])),
            Access("in", 2, ((r0, r1), (0, ins[2][1]))), Access("in", 3, full(ins[3])),
            Access("in", 4, full(ins[4])), Access("out", 0, cache_box(p, outs[0]))]


def append(p, y, t, freqs, cache, op):
    """cache[r // hd, t, r % hd] = y (rotated first for keys) for rows r of the range."""
    hd, r0, r1 = p["head_dim"], p["row0"], p["row0"] + p["nrows"]
    if not 0 <= t < cache.shape[1]:
        raise ValueError(f"{op}: position {t} outside KV capacity {cache.shape[1]}")
    if p["rope"]:
        y = rotate_pairs(y, r0, hd, t, freqs)
    r = torch.arange(r0, r1, device=cache.device)
    cache[r // hd, t, r % hd] = y.to(cache.dtype)


def reference(p, ins, outs):
    x, g, w, pos, freqs = ins
    r0, r1 = p["row0"], p["row0"] + p["nrows"]
    append(p, matvec(w[r0:r1], norm_input(p, x, g)), int(pos[0]), freqs, outs[0], "RMS_LINEAR_KV")


SPEC = OpSpec(
    op=Op.RMS_LINEAR_KV,
    inputs=(Slot("x", ACT, (DType.F32,)), Slot("gamma", W), Slot("w", W), Slot("pos", INP, (DType.I32,)),
            Slot("freqs", W, (DType.F32,))),
    outputs=(Slot("cache", KV),),
    params=("row0", "nrows", "eps", "norm", "head_dim", "rope"), float_params=frozenset({"eps"}),
    check=check, accesses=accesses, reference=reference, streams=row_stream,
    cost=lambda p, ins, isz: tile_cost(p, ins[2][1], isz[2]),
)


def check_append(p, ins, outs):
    probs, n = check_vec_op(p, ins, rope=p["rope"] == 1)
    need(p["rope"] in (0, 1), probs, f"rope={p['rope']} must be 0 or 1")
    hd, cache = p["head_dim"], tuple(outs[0])
    need(len(cache) == 3 and cache[2] == hd, probs, f"cache has shape {cache}, expected (kv_heads, capacity, {hd})")
    if len(cache) == 3 and n is not None:
        need(n == cache[0] * hd, probs, f"a has {n} elements, cache holds {cache[0]}x{hd}")
    return probs


def reference_append(p, ins, outs):
    a, pos, freqs = ins
    append(p, a[p["row0"]:p["row0"] + p["nrows"]].float(), int(pos[0]), freqs, outs[0], "KV_APPEND")


APPEND = OpSpec(
    op=Op.KV_APPEND,
    inputs=(Slot("a", ACT, (DType.F32,)), Slot("pos", INP, (DType.I32,)), Slot("freqs", W, (DType.F32,))),
    outputs=(Slot("cache", KV),),
    params=("row0", "nrows", "head_dim", "rope"), float_params=frozenset(),
    check=check_append,
    accesses=lambda p, i, o: [Access("in", 0, ((p["row0"], p["row0"] + p["nrows"]),)), Access("in", 1, full(i[1])),
                              Access("in", 2, full(i[2])), Access("out", 0, cache_box(p, o[0]))],
    reference=reference_append, streams=lambda p, ins: [],
    cost=lambda p, ins, isz: (4 * p["nrows"], 6 * p["nrows"]),
)
