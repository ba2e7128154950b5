"""The KV cache as the appending opcodes see it: [kv_heads, capacity, head_dim], row r of a
projection is element r % head_dim of KV head r // head_dim, written at position pos."""
from __future__ import annotations

import torch

from megavm.core.types import Buffer
from megavm.instructions.rotary import rotate_pairs
from megavm.instructions.spec import Box, Param, need

ROPE = Param("rope", "1: rotate the rows (keys) before appending them; 0: append them as they are (values)")


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


def append(p: dict, y: torch.Tensor, t: int, freqs: torch.Tensor, cache: torch.Tensor, op: str) -> None:
    """cache[r // hd, t, r % hd] = y (rotated first when p["rope"]) for rows r of the range."""
    hd, r0, r1 = p["head_dim"], p["row0"], p["row0"] + p["nrows"]
    if not 0 <= t < cache.shape[1]:
        raise ValueError(f"{op}: position {t} outside KV capacity {cache.shape[1]}")
    if p["rope"]:
        y = rotate_pairs(y, r0, hd, t, freqs)
    r = torch.arange(r0, r1, device=cache.device)
    cache[r // hd, t, r % hd] = y.to(cache.dtype)
