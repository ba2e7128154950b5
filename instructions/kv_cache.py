"""The KV cache as the appending opcodes see it: [kv_heads, capacity, head_dim], row r of a
projection is element r % head_dim of KV head r // head_dim, written at position pos.

Swizzled rows: in a bf16 or e4m3 cache whose head_dim is a multiple of 64, cache row t keeps its 16-byte
chunk c at chunk c ^ x(t): x(t) = t % 8, or (t // 2) % 4 for e4m3 rows of 64 codes (two rows a 128-byte
line). Eight consecutive rows then hold any one chunk on eight different shared-memory bank groups once a
ring stage holds them, so the tensor-core attention partial (instructions/attn_mma.cuh,
attn_mma_e4m3.cuh), whose ldmatrix reads one chunk of 8 keys at once, reads them in one pass instead of
several. The map is its own inverse; `logical` reads rows back in order."""
from __future__ import annotations

import torch

from megavm.core.types import Buffer
from megavm.instructions.rotary import rotate_pairs
from megavm.instructions.spec import Box, Param, need

ROPE = Param("rope", "1: rotate the rows (keys) before appending them; 0: append them as they are (values)")


def swizzled(rows: torch.Tensor) -> bool:
    """Whether a cache (or rows for one) keeps its rows swizzled: bf16 or e4m3, head_dim a multiple of 64."""
    return rows.dtype in (torch.bfloat16, torch.float8_e4m3fn) and rows.shape[-1] % 64 == 0


def columns(cache: torch.Tensor, t: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
    """Where element e of cache row t lies in the row (broadcast over t and e)."""
    if not swizzled(cache):
        return e
    if cache.dtype == torch.bfloat16:                           # 8 elements a chunk
        return e ^ ((t & 7) << 3)
    x = (t >> 1) & 3 if cache.shape[-1] == 64 else t & 7        # e4m3: 16 codes a chunk
    return e ^ (x << 4)


def swizzle(rows: torch.Tensor, t0: int = 0) -> torch.Tensor:
    """rows [..., n, head_dim], elements in order, as cache rows t0 .. t0 + n keep them; the map is its
    own inverse, so it also reads such cache rows back in order. Whoever writes a KV history into a
    cache buffer by hand (a prefill, a test) writes swizzle(rows, t0)."""
    if not swizzled(rows):
        return rows
    n, hd = rows.shape[-2:]
    t = torch.arange(t0, t0 + n, device=rows.device)[:, None]
    idx = columns(rows, t, torch.arange(hd, device=rows.device)[None, :])
    if rows.dtype == torch.float8_e4m3fn:                       # gathered as bytes
        return torch.gather(rows.view(torch.uint8), -1, idx.expand(rows.shape)).view(rows.dtype)
    return torch.gather(rows, -1, idx.expand(rows.shape))


def logical(cache: torch.Tensor, h: int, lo: int, hi: int) -> torch.Tensor:
    """Rows lo..hi of KV head h, elements in order: [hi - lo, head_dim]."""
    return swizzle(cache[h, lo:hi], lo)


def check_cache(p: dict, cache: Buffer, rows: int | None, problems: list[str], what: str = "w has {} rows") -> None:
    """cache is (kv_heads, capacity, head_dim) and holds `rows` projection rows (None: unknown)."""
    hd, shape = p["head_dim"], cache.shape
    need(len(shape) == 3 and shape[2] == hd, problems, f"cache has shape {shape}, expected (kv_heads, capacity, {hd})")
    if len(shape) == 3 and rows is not None:
        need(rows == shape[0] * hd, problems, f"{what.format(rows)}, cache holds {shape[0]}x{hd}")
    need(p["rope"] in (0, 1), problems, f"rope={p['rope']} must be 0 or 1")


def cache_box(p: dict, cache: Buffer) -> Box:
    """The cache region rows [row0, row0 + nrows) append to (every position: pos is a runtime input)."""
    hd = p["head_dim"]
    r0, r1 = p["row0"], p["row0"] + p["nrows"]
    h0, h1 = r0 // hd, (r1 - 1) // hd + 1
    # a tile inside one head writes a column range; one spanning heads writes them whole
    cols = (r0 % hd, (r1 - 1) % hd + 1) if h1 - h0 == 1 else (0, hd)
    return ((h0, h1), (0, cache.shape[1]), cols)


def append(p: dict, y: torch.Tensor, t: int, freqs: torch.Tensor, cache: torch.Tensor, op: str) -> torch.Tensor:
    """cache[r // hd, t, r % hd] = y (rotated first when p["rope"]) for rows r of the range; returns the
    rows as appended, before the cache's rounding."""
    hd, r0, r1 = p["head_dim"], p["row0"], p["row0"] + p["nrows"]
    if not 0 <= t < cache.shape[1]:
        raise ValueError(f"{op}: position {t} outside KV capacity {cache.shape[1]}")
    if p["rope"]:
        y = rotate_pairs(y, r0, hd, t, freqs)
    r = torch.arange(r0, r1, device=cache.device)
    cache[r // hd, t, columns(cache, torch.tensor(t, device=cache.device), r % hd)] = y.to(cache.dtype)
    return y
