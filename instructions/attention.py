"""Decode attention split over (KV head, KV block), what its opcodes share.

A partial of query head g of KV head h over block b is [m, l, acc[0:hd]]: the running max of the
scores, the sum of exp(score - m) and the unnormalised exp-weighted sum of values, over keys
[b * bs, min((b + 1) * bs, pos + 1)); a block past pos is m = -inf, l = 0. Partials live in a buffer
[kv_heads, blocks, group, head_dim + 2]; ATTN_COMBINE (or LINEAR_RESIDUAL on load) merges them.

The shared-memory layouts of the kernel's partial and combine are described here once: the lowering
picks block sizes and the partial's history params from them, and the validator checks against them.
"""
from __future__ import annotations

import torch

from megavm.core.limits import MAX_K
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


def partial_scratch(g: int, hd: int, bs: int) -> int:
    """Floats of the partial's own scratch (q, then the scores of its block), whole 16-byte words;
    the K/V history copies land right after it (param hist_at)."""
    return (g * hd + g * bs + 3) & ~3


def history_rows(g: int, hd: int, bs: int, itemsize: int) -> int:
    """K/V rows (each of K and V) of the partial's block that fit in shared memory after its scratch
    (param hist_rows): the kernel copies a block's history there when it fits, else reads from L2."""
    return max(0, (4 * MAX_K - 4 * partial_scratch(g, hd, bs)) // (2 * hd * itemsize))


def history_block_limit(g: int, hd: int, itemsize: int) -> int:
    """The largest block size whose whole K/V history fits (history_rows >= block size)."""
    return max(0, (4 * MAX_K - 4 * (g * hd + 3)) // (4 * g + 2 * hd * itemsize))
