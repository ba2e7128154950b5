"""ATTN_PARTIAL: one (KV head, KV block) of decode attention -> a partial (m, l, acc) per query head
of the KV head's group, over the block's keys up to pos (with one block a KV head, the output may instead be
the attention output itself, [q's shape], each of the head's rows acc / l: what ATTN_COMBINE makes of one
block); with a sliding window, only the last
`window` positions' keys (instructions/attention.py). A quantized cache (instructions/kv_quant.py)
comes with its scales [kv_heads, capacity]: e4m3 key and value rows are code x their position's scale;
e2m1 (NVFP4) rows also take their block scales [kv_heads, capacity, head_dim / 16] (k_bscale,
v_bscale): e2m1(code) x block scale x the position's scale."""
import math

import torch

from megavm.core.limits import MAX_GROUP, MAX_HEAD_DIM, MAX_K, MAX_KV_BLOCK
from megavm.instructions.attention import HISTORY_WINDOW, KV_HEAD, combine, partial_scratch
from megavm.core.codecs import nvfp4_values
from megavm.instructions.kv_cache import logical
from megavm.core.types import DType
from megavm.instructions.spec import (
    ACT,
    F32,
    FLOAT,
    I32,
    INP,
    KV,
    POSITION,
    Access,
    Hook,
    OpSpec,
    Param,
    Slot,
    Stream,
    full,
    need,
)


def _scales(ins):
    """(k_scale, v_scale): None for an unquantized cache (slots left empty or left out)."""
    return tuple(ins[i] if len(ins) > i else None for i in (4, 5))


def _block_scales(ins):
    """(k_bscale, v_bscale): an e2m1 cache's block scales, else None."""
    return tuple(ins[i] if len(ins) > i else None for i in (8, 9))


def check(p, ins, outs):
    probs = []
    q, kc, vc, pos = ins[:4]
    ks, vs = _scales(ins)
    kb, vb = _block_scales(ins)
    part = outs[0].shape
    need(len(kc.shape) == 3 and kc.shape == vc.shape and kc.dtype == vc.dtype, probs,
         f"k cache {kc.shape} and v cache {vc.shape} must be equal 3-D shapes of one dtype")
    coded = kc.dtype in (DType.F8E4M3, DType.E2M1)
    blocked = kc.dtype == DType.E2M1
    need(coded == (ks is not None) and coded == (vs is not None), probs,
         f"a {kc.dtype.name} cache takes {'its k_scale and v_scale' if coded else 'no scales'}")
    need(blocked == (kb is not None) and blocked == (vb is not None), probs,
         f"a {kc.dtype.name} cache takes {'its k_bscale and v_bscale' if blocked else 'no block scales'}")
    for s in (ks, vs):
        if coded and s is not None:
            need(s.shape == kc.shape[:2], probs, f"scales {s.shape} do not fit cache {kc.shape}")
    for s in (kb, vb):
        if blocked and s is not None and len(kc.shape) == 3:
            need(s.dtype == DType.F8E4M3 and s.shape == kc.shape[:2] + (kc.shape[2] // 16,), probs,
                 f"block scales {s.dtype.name} {s.shape} do not fit cache {kc.shape}: expected F8E4M3 "
                 f"{kc.shape[:2] + (kc.shape[2] // 16,)}")
    need(len(part) in (1, 4), probs, f"partials must be 4-D (or the 1-D attention output), have shape {part}")
    if probs:
        return probs
    nkv, cap, hd = kc.shape
    if len(part) == 1:                             # one block: the attention output, normalised
        g = q.shape[0] // (nkv * hd) if len(q.shape) == 1 else 0
        nblk = 1
        need(part == q.shape, probs, f"attention output {part} must have q's shape {q.shape}")
    else:
        _, nblk, g, w = part
        need(part[0] == nkv and w == hd + 2, probs, f"partials {part} do not fit cache {kc.shape}")
    bs = p["block_size"]
    need(q.shape == (nkv * g * hd,) and g >= 1, probs, f"q has shape {q.shape}, expected ({nkv * max(g, 1) * hd},)")
    need(pos.shape == (1,), probs, f"pos has shape {pos.shape}, expected (1,)")
    need(0 <= p["kv_head"] < nkv, probs, f"kv_head={p['kv_head']} outside {nkv} KV heads")
    need(0 <= p["block"] < nblk, probs, f"block={p['block']} outside {nblk} blocks")
    need(1 <= bs <= MAX_KV_BLOCK and nblk * bs >= cap, probs,
         f"{nblk} blocks of {bs} (at most {MAX_KV_BLOCK}) do not cover capacity {cap}")
    need(hd % 8 == 0 and hd <= MAX_HEAD_DIM, probs, f"head_dim={hd} must be a multiple of 8 and <= {MAX_HEAD_DIM}")
    need(not coded or hd % 16 == 0, probs, f"head_dim={hd} of e4m3 rows must be a multiple of 16")
    need(not blocked or hd % 32 == 0, probs, f"head_dim={hd} of e2m1 rows must be a multiple of 32")
    need(g <= MAX_GROUP, probs, f"group size {g} exceeds capacity {MAX_GROUP}")
    need(partial_scratch(g, hd, bs, kc.dtype) <= MAX_K, probs,
         f"{g} query heads x {bs} keys of scores and head_dim={hd} overrun the {MAX_K} floats of shared memory")
    need(p["window"] >= 0, probs, f"window={p['window']} must be >= 0 (0: none)")
    kr, vr = _rows(ins)
    need((kr is None) == (vr is None), probs, "k_row and v_row come together (this step's K and V rows)")
    for r, what in ((kr, "k_row"), (vr, "v_row")):
        need(r is None or r.shape == (nkv * hd,), probs, f"{what} has shape {r.shape if r else ''}, expected "
                                                           f"({nkv * hd},)")
    need(kr is None or not coded, probs, f"a {kc.dtype.name} cache takes no k_row / v_row (KV_QUANT appends its rows)")
    return probs


def _rows(ins):
    """(k_row, v_row): this step's K and V rows in f32, or None (the partial reads its own row from the
    cache)."""
    return tuple(ins[i] if len(ins) > i else None for i in (6, 7))


def _group(ins, outs) -> int:
    """Query heads a KV head: the partials' third axis, or q's length over the cache's heads and head_dim."""
    nkv, _, hd = ins[1].shape
    return outs[0].shape[2] if len(outs[0].shape) == 4 else ins[0].shape[0] // (nkv * hd)


def shared(p, ins, outs):
    """partial_scratch of the task's group, head_dim, block and cache (what check holds to MAX_K)."""
    return partial_scratch(_group(ins, outs), ins[1].shape[2], p["block_size"], ins[1].dtype)


def accesses(p, ins, outs):
    nkv, cap, hd = ins[1].shape
    g = _group(ins, outs)
    h, b, bs = p["kv_head"], p["block"], p["block_size"]
    direct = len(outs[0].shape) == 1
    keys = (min(b * bs, cap), min((b + 1) * bs, cap))
    rows = _rows(ins)
    hist = rows[0] is not None                     # this step's row from k_row / v_row: the cache's are older
    return [Access("in", 0, ((h * g * hd, (h + 1) * g * hd),)),
            Access("in", 1, ((h, h + 1), keys, (0, hd)), hist), Access("in", 2, ((h, h + 1), keys, (0, hd)), hist),
            Access("in", 3, full(ins[3].shape)),
            Access("out", 0, ((h * g * hd, (h + 1) * g * hd),) if direct
                   else ((h, h + 1), (b, b + 1), (0, g), (0, hd + 2)))] + [
        Access("in", 4 + i, ((h, h + 1), keys)) for i, s in enumerate(_scales(ins)) if s is not None] + [
        Access("in", 6 + i, ((h * hd, (h + 1) * hd),)) for i, r in enumerate(rows) if r is not None] + [
        Access("in", 8 + i, ((h, h + 1), keys, (0, hd // 16))) for i, s in enumerate(_block_scales(ins)) if s is not None]


def reference(p, ins, outs):
    q, kc, vc, pos = ins[:4]
    ks, vs = _scales(ins)
    kb, vb = _block_scales(ins)
    part = outs[0]
    t = int(pos[0])
    if not 0 <= t < kc.shape[1]:
        raise ValueError(f"ATTN_PARTIAL: position {t} outside KV capacity {kc.shape[1]}")
    h, b, bs = p["kv_head"], p["block"], p["block_size"]
    direct = part.dim() == 1
    if direct:                      # head_dim from the stored cache: e2m1 rows hold two codes a byte
        hd = kb.shape[2] * 16 if kb is not None else kc.shape[2]
        g = q.shape[0] // (kc.shape[0] * hd)
    else:
        g, hd = part.shape[2], part.shape[3] - 2
    lo, hi = b * bs, min((b + 1) * bs, t + 1)
    if p["window"]:
        lo = max(lo, t - p["window"] + 1)
    out = part.new_empty(g, hd + 2) if direct else part[h, b]  # [g, hd+2]; on the outputs' device
    if hi <= lo:
        out[:, 0] = -math.inf
        out[:, 1:] = 0
        if direct:
            part[h * g * hd:(h + 1) * g * hd] = 0
        return
    qh = q[h * g * hd:(h + 1) * g * hd].view(g, hd).float()      # [g, hd]
    if kb is not None:                                          # e2m1: code x block scale x the position's
        keys = nvfp4_values(kc[h, lo:hi], kb[h, lo:hi], ks[h, lo:hi, None])
        vals = nvfp4_values(vc[h, lo:hi], vb[h, lo:hi], vs[h, lo:hi, None])
    else:
        keys, vals = logical(kc, h, lo, hi).float(), logical(vc, h, lo, hi).float()
    if ks is not None and kb is None:                           # e4m3 codes x their position's scale
        keys, vals = keys * ks[h, lo:hi, None], vals * vs[h, lo:hi, None]
    s = (keys @ qh.T) * p["scale"]                              # [n, g]
    m = s.max(dim=0).values                                     # [g]
    e = torch.exp(s - m)
    out[:, 0] = m
    out[:, 1] = e.sum(dim=0)
    out[:, 2:] = e.T @ vals
    if direct:                                                  # the one block's output, normalised
        part[h * g * hd:(h + 1) * g * hd] = combine(out[None]).flatten()


def streams(p, ins, outs):
    """The block's K and V rows before pos, which earlier steps wrote: the loader copies them through
    the ring (history streams) once the partial's wait on their writers was met a step before. A
    window the stream cannot name (2**16 or more, below capacity) leaves them to L2 loads."""
    nkv, cap, hd = ins[1].shape
    window = p["window"] if p["window"] < cap else 0
    if window > HISTORY_WINDOW:
        return []
    h, b, bs = p["kv_head"], p["block"], p["block_size"]
    k0, k1 = min(b * bs, cap), min((b + 1) * bs, cap)
    return [Stream(slot, (h * cap + k0) * hd, (k1 - k0) * hd, window=window) for slot in (1, 2)]


def cost(p, ins, outs):
    """(bytes, flops) of a full block: its K and V rows, with a quantized cache's scales (4 bytes a row)
    and e2m1 block scales (one byte per 16 elements)."""
    hd, isz = ins[1].shape[2], ins[1].dtype.itemsize
    ks, kb = _scales(ins)[0], _block_scales(ins)[0]
    row = hd * isz + (4 if ks is not None else 0) + (hd // 16 if kb is not None else 0)
    return int(2 * p["block_size"] * row), 4 * p["block_size"] * hd


SPEC = OpSpec(
    name="ATTN_PARTIAL", code=6, doc=__doc__,
    shared=shared,
    inputs=(Slot("q", ACT, F32, tagged=True), Slot("k_cache", KV, FLOAT + (DType.F8E4M3, DType.E2M1)),
            Slot("v_cache", KV, FLOAT + (DType.F8E4M3, DType.E2M1)),
            Slot("pos", INP, I32, role=POSITION, bound=("k_cache", 1)),
            Slot("k_scale", KV, F32, optional=True), Slot("v_scale", KV, F32, optional=True),
            Slot("k_row", ACT, F32, optional=True, tagged=True), Slot("v_row", ACT, F32, optional=True, tagged=True),
            Slot("k_bscale", KV, (DType.F8E4M3,), optional=True), Slot("v_bscale", KV, (DType.F8E4M3,), optional=True)),
    outputs=(Slot("part", ACT, F32, tagged=True),),     # [kv_heads, blocks, group, head_dim + 2], or [q's shape]
    params=(KV_HEAD, Param("block", "the KV block: keys [block * block_size, min((block + 1) * block_size, pos + 1))"),
            Param("block_size", "keys per block"), Param("scale", "the score scale, head_dim ** -0.5", f32=True),
            Param("window", "a sliding window: only keys after pos - window are seen; 0: every key")),
    check=check, accesses=accesses, reference=reference, cost=cost, streams=streams,
    prewait=Hook("scales_prewait", ("k_cache", "k_scale", "v_scale", "k_bscale", "v_bscale", "kv_head", "block",
                                    "block_size")),
)
