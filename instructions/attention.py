"""ATTN_PARTIAL and ATTN_COMBINE: decode attention split over (KV head, KV block).

part[h, b, g] = [m, l, acc[0:hd]]: the running max, the sum of exp(s - m) and the unnormalised
weighted sum of values of query head h*G+g over keys [b*bs, min((b+1)*bs, pos+1)). A block past pos
writes m=-inf, l=0. ATTN_COMBINE merges the blocks of one KV head in block order.
"""
import math

import torch

from instructions.common import MAX_K
from instructions.spec import ACT, INP, KV, Access, Op, OpSpec, Slot, full, need
from schedule.ir import DType


def history_block_limit(group: int, head_dim: int, itemsize: int) -> int:
    """The largest block size whose K/V history the kernel copies into shared memory (attention.cuh:
    attn_hist_rows): scratch floats plus the block's K and V rows within MAX_K floats. Larger blocks
    still run, reading their rows from L2."""
    fixed = 4 * (group * head_dim + 3)
    return max(0, (4 * MAX_K - fixed) // (4 * group + 2 * head_dim * itemsize))


def check_partial(p, ins, outs):
    probs = []
    q, kc, vc, pos = ins
    part = outs[0]
    need(len(kc) == 3 and tuple(kc) == tuple(vc), probs, f"k cache {tuple(kc)} and v cache {tuple(vc)} must be equal 3-D shapes")
    need(len(part) == 4, probs, f"partials must be 4-D, have shape {tuple(part)}")
    if probs:
        return probs
    nkv, cap, hd = kc
    _, nblk, g, w = part
    need(part[0] == nkv and w == hd + 2, probs, f"partials {tuple(part)} do not fit cache {tuple(kc)}")
    need(tuple(q) == (nkv * g * hd,), probs, f"q has shape {tuple(q)}, expected ({nkv * g * hd},)")
    need(tuple(pos) == (1,), probs, f"pos has shape {tuple(pos)}, expected (1,)")
    need(0 <= p["kv_head"] < nkv, probs, f"kv_head={p['kv_head']} outside {nkv} KV heads")
    need(0 <= p["block"] < nblk, probs, f"block={p['block']} outside {nblk} blocks")
    need(p["block_size"] >= 1 and nblk * p["block_size"] >= cap, probs,
         f"{nblk} blocks of {p['block_size']} do not cover capacity {cap}")
    need(hd % 8 == 0 and hd <= 256, probs, f"head_dim={hd} must be a multiple of 8 and <= 256")
    need(g <= 16, probs, f"group size {g} exceeds capacity 16")
    need(g * (hd + p["block_size"]) <= MAX_K, probs,
         f"group {g} x (head_dim {hd} + block_size {p['block_size']}) exceeds the scratch of {MAX_K} floats")
    need(p["block_size"] <= 1024, probs, f"block_size={p['block_size']} exceeds capacity 1024")
    return probs


def accesses_partial(p, ins, outs):
    nkv, cap, hd = ins[1]
    g = outs[0][2]
    h, b, bs = p["kv_head"], p["block"], p["block_size"]
    keys = (min(b * bs, cap), min((b + 1) * bs, cap))
    return [Access("in", 0, ((h * g * hd, (h + 1) * g * hd),)),
            Access("in", 1, ((h, h + 1), keys, (0, hd))), Access("in", 2, ((h, h + 1), keys, (0, hd))),
            Access("in", 3, full(ins[3])), Access("out", 0, ((h, h + 1), (b, b + 1), (0, g), (0, hd + 2)))]


def reference_partial(p, ins, outs):
    q, kc, vc, pos = ins
    part = outs[0]
    t = int(pos[0])
    if not 0 <= t < kc.shape[1]:
        raise ValueError(f"ATTN_PARTIAL: position {t} outside KV capacity {kc.shape[1]}")
    h, b, bs = p["kv_head"], p["block"], p["block_size"]
    g, hd = part.shape[2], kc.shape[2]
    lo, hi = b * bs, min((b + 1) * bs, t + 1)
    out = part[h, b]                                            # [g, hd+2]
    if hi <= lo:
        out[:, 0] = -math.inf
        out[:, 1:] = 0
        return
    qh = q[h * g * hd:(h + 1) * g * hd].view(g, hd).float()      # [g, hd]
    s = (kc[h, lo:hi].float() @ qh.T) * p["scale"]              # [n, g]
    m = s.max(dim=0).values                                     # [g]
    e = torch.exp(s - m)
    out[:, 0] = m
    out[:, 1] = e.sum(dim=0)
    out[:, 2:] = e.T @ vc[h, lo:hi].float()


def check_combine(p, ins, outs):
    probs = []
    part, attn = ins[0], outs[0]
    need(len(part) == 4, probs, f"partials must be 4-D, have shape {tuple(part)}")
    if probs:
        return probs
    nkv, nblk, g, w = part
    need(tuple(attn) == (nkv * g * (w - 2),), probs, f"attn has shape {tuple(attn)}, expected ({nkv * g * (w - 2)},)")
    need(0 <= p["kv_head"] < nkv, probs, f"kv_head={p['kv_head']} outside {nkv} KV heads")
    need(g * (2 * nblk + 1) <= MAX_K, probs, f"group {g} x {nblk} blocks exceeds the combine's scratch of {MAX_K} floats")
    return probs


def accesses_combine(p, ins, outs):
    _, nblk, g, w = ins[0]
    h, hd = p["kv_head"], w - 2
    return [Access("in", 0, ((h, h + 1), (0, nblk), (0, g), (0, w))),
            Access("out", 0, ((h * g * hd, (h + 1) * g * hd),))]


def combine(part: torch.Tensor) -> torch.Tensor:
    """The attention output of the partials of one KV head [nblk, g, hd+2] -> [g * hd]."""
    m = part[:, :, 0]
    mx = m.max(dim=0).values                                    # [g]
    scale = torch.exp(m - mx)                                   # [nblk, g]; empty blocks -> 0
    denom = (part[:, :, 1] * scale).sum(dim=0)
    acc = (part[:, :, 2:] * scale[:, :, None]).sum(dim=0)       # [g, hd]
    return (acc / denom[:, None]).reshape(-1)


def combine_scratch(part_shape) -> int:
    """Floats of shared memory the kernel's combine of every head of a partials buffer needs
    (attention.cuh: combine_heads): its output vector, then block weights, l and denominators."""
    nkv, nblk, g, w = part_shape
    return nkv * g * (w - 2) + nkv * g * (2 * nblk + 1)


def reference_combine(p, ins, outs):
    h = p["kv_head"]
    out = combine(ins[0][h])
    outs[0][h * out.numel():(h + 1) * out.numel()] = out


def cost_partial(p, ins, isz):
    hd = ins[1][2]
    return 2 * p["block_size"] * hd * isz[1], 4 * p["block_size"] * hd


PARTIAL = OpSpec(
    op=Op.ATTN_PARTIAL,
    inputs=(Slot("q", ACT, (DType.F32,)), Slot("k_cache", KV), Slot("v_cache", KV), Slot("pos", INP, (DType.I32,))),
    outputs=(Slot("part", ACT, (DType.F32,)),),
    params=("kv_head", "block", "block_size", "scale"), float_params=frozenset({"scale"}),
    check=check_partial, accesses=accesses_partial, reference=reference_partial,
    streams=lambda p, ins: [], cost=cost_partial,
)

COMBINE = OpSpec(
    op=Op.ATTN_COMBINE,
    inputs=(Slot("part", ACT, (DType.F32,)),),
    outputs=(Slot("attn", ACT, (DType.F32,)),),
    params=("kv_head",), float_params=frozenset(),
    check=check_combine, accesses=accesses_combine, reference=reference_combine,
    streams=lambda p, ins: [],
    cost=lambda p, ins, isz: (ins[0][1] * ins[0][2] * ins[0][3] * 4, 0),
)
