"""Rotary position embedding as the opcodes apply it: rows in interleaved pairs (rows 2i and 2i+1 of
a head rotate together by pos * freqs[i]), which the model's weight preparation produces from the
usual rotate-half layout; freqs[i] is the inverse frequency of pair i (any scaling already applied)."""
from __future__ import annotations

import torch

from megavm.core.types import Buffer
from megavm.instructions.spec import Param, need
from megavm.instructions.tiles import check_vec_rows, vector_len

HEAD_DIM = Param("head_dim", "rows per head: RoPE pairs and KV-cache rows are located with it")


def rotate_pairs(y: torch.Tensor, row0: int, head_dim: int, pos: int, freqs: torch.Tensor) -> torch.Tensor:
    """y: [n] f32 rows row0.. of interleaved heads -> rotated copy."""
    n = y.shape[0]
    pair = (torch.arange(row0, row0 + n, 2, device=y.device) % head_dim) // 2
    ang = pos * freqs.float()[pair]
    c, s = torch.cos(ang), torch.sin(ang)
    a, b = y[0::2], y[1::2]
    out = torch.empty_like(y)
    out[0::2] = a * c - b * s
    out[1::2] = b * c + a * s
    return out


def check_pairs(p: dict, problems: list[str], what: str = "tiles") -> None:
    """Rows [row0, row0 + nrows) are whole RoPE pairs of heads of head_dim."""
    hd = p["head_dim"]
    need(hd >= 2 and hd % 2 == 0, problems, f"head_dim={hd} must be even")
    need(p["row0"] % 2 == 0 and p["nrows"] % 2 == 0, problems, f"RoPE {what} must hold whole row pairs")


def check_pos(pos: Buffer, problems: list[str]) -> None:
    need(pos.shape == (1,), problems, f"pos has shape {pos.shape}, expected (1,)")


def check_freqs(p: dict, freqs: Buffer, problems: list[str]) -> None:
    hd = p["head_dim"]
    need(freqs.shape == (hd // 2,), problems, f"freqs has shape {freqs.shape}, expected ({hd // 2},)")


def check_pos_freqs(p: dict, pos: Buffer, freqs: Buffer, problems: list[str]) -> None:
    """A (1,) position and head_dim / 2 frequencies."""
    check_pos(pos, problems)
    check_freqs(p, freqs, problems)


def check_vector_range(p: dict, a: Buffer, problems: list[str]) -> int | None:
    """ROPE / KV_APPEND: rows [row0, row0 + nrows) of vector a -> a's length, or None."""
    n = vector_len(a, problems, "a")
    if n is not None:
        check_vec_rows(p, n, problems)
    return n
