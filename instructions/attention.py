"""Decode attention split over (KV head, KV block), what its opcodes share.

A partial of query head g of KV head h over block b is [m, l, acc[0:hd]]: the running max of the
scores, the sum of exp(score - m) and the unnormalised exp-weighted sum of values, over keys
[b * bs, min((b + 1) * bs, pos + 1)); a block past pos is m = -inf, l = 0. Partials live in a buffer
[kv_heads, blocks, group, head_dim + 2]; ATTN_COMBINE (or LINEAR_RESIDUAL on load) merges them.

The shared-memory layouts of the kernel's partial and combine are described here once: the lowering
picks block sizes from them, and the validator checks against them.
"""
from __future__ import annotations

import torch

from megavm.core.abi import STREAM_WINDOW_MAX
from megavm.core.limits import ATTN_KEY_SPLITS, MAX_K, STAGE_BYTES
from megavm.core.types import DType
from megavm.instructions.spec import Param

KV_HEAD = Param("kv_head", "the KV head (and its group of query heads) the task serves")


def combine(part: torch.Tensor) -> torch.Tensor:
    """The attention output of the partials of one KV head [nblk, g, hd+2] -> [g * hd]."""
    m = part[:, :, 0]
    mx = m.max(dim=0).values                                    # [g]
    scale = torch.exp(m - mx)                                   # [nblk, g]; empty blocks -> 0
    denom = (part[:, :, 1] * scale).sum(dim=0)
    acc = (part[:, :, 2:] * scale[:, :, None]).sum(dim=0)       # [g, hd]
    return (acc / denom[:, None]).reshape(-1)


def combine_scratch(nkv: int, nblk: int, g: int) -> int:
    """Floats of shared memory the kernel's combine of nkv heads needs beside its output (attention.cuh:
    combine_heads): per (head, query head) the block weights and sums, then the denominator."""
    return nkv * g * (2 * nblk + 1)


def head_batch(g: int) -> int:
    """Query heads a partial's score lanes hold at once (attn_partial.cuh): 1, 2 or 4."""
    return 1 if g <= 1 else 2 if g <= 2 else 4


def mma_shape(g: int, hd: int) -> bool:
    """A group the partial may run on tensor cores (attn_partial.cuh: attn_mma; it also needs bf16 rows
    through the ring): at most 8 query heads of head_dim 64 or 128. bf16 rows at head_dim 256 run there
    too (attn_mma_256) with ATTN_KEY_SPLITS / 4 key splits of four warps, each warp a quarter of head_dim:
    within the CUDA-core path's splits that partial_scratch sizes them by."""
    return g <= 8 and hd in (64, 128)


def staged_scales(g: int, hd: int, coded: DType | None) -> int:
    """Floats of a quantized cache's scales the tensor-core partial stages in shared memory (attn_scales.cuh:
    pass_scales): two buffers, each the row scales of a ring stage's keys and the own row (4 spare), and of
    an e2m1 cache their block scales (head_dim / 16 bytes a key). 0 for other caches and shapes, and for
    e2m1 at head_dim 128, whose loops read the scales from L2 (attn_mma_e2m1.cuh: E2M1_STAGED)."""
    e2m1 = coded == DType.E2M1
    if coded not in (DType.F8E4M3, DType.E2M1) or not mma_shape(g, hd) or (e2m1 and hd != 64):
        return 0
    keys = STAGE_BYTES // (hd // 2 if e2m1 else hd) + 4
    return 2 * keys * (1 + (hd // 64 if e2m1 else 0))


def partial_scratch(g: int, hd: int, bs: int, coded: DType | None = None) -> int:
    """Floats of the partial's shared memory (attn_partial.cuh): q, then the scores of its block, which
    the value sums of its key splits (ATTN_KEY_SPLITS for a shape the tensor-core path may take, else
    ATTN_KEY_SPLITS // the groups of head_batch heads; each split [g, hd + 2]) overwrite at the end,
    the score maxima, then, 16-byte aligned, the step's own K and V rows (f32 at most), then a quantized
    cache's staged scales (`coded`: the cache's dtype; staged_scales)."""
    splits = ATTN_KEY_SPLITS if mma_shape(g, hd) else max(1, ATTN_KEY_SPLITS // -(-g // head_batch(g)))
    return ((g * hd + max(g * bs, splits * g * (hd + 2)) + g + 3) // 4 * 4 + 2 * hd
            + staged_scales(g, hd, coded))


def scores_fit(g: int, hd: int, coded: DType | None = None) -> int:
    """The largest block size whose partial scratch fits in shared memory (0: none does)."""
    bs = max(0, (MAX_K - 2 * hd - g * hd - g - 3 - staged_scales(g, hd, coded)) // g)
    return bs if partial_scratch(g, hd, bs, coded) <= MAX_K else 0


# The largest sliding window a history stream names (core/abi.py: two bytes of mvm_stream_t)
HISTORY_WINDOW = STREAM_WINDOW_MAX
