"""Pieces several opcodes share: the RMSNorm prologue, row-tile checks and costs."""
from __future__ import annotations

import torch

from instructions.spec import need

# NOTE: capacities of the megakernel's shared memory; abi.h asserts the same numbers.
MAX_TILE_ROWS = 256
MAX_K = 16384


def rms_normed(x: torch.Tensor, gamma: torch.Tensor, eps: float) -> torch.Tensor:
    """x: [K] f32 -> gamma * x / rms(x), in f32."""
    xf = x.float()
    return gamma.float() * (xf * torch.rsqrt(xf.pow(2).mean() + eps))


def norm_input(p: dict, x: torch.Tensor, gamma: torch.Tensor) -> torch.Tensor:
    """What a normed projection multiplies: rmsnorm(x, gamma) when its `norm` param is 1 (the fused
    RMSNorm), x itself when 0 (x was normalised by an RMSNORM task: the unfused ablation)."""
    return rms_normed(x, gamma, p["eps"]) if p["norm"] else x.float()


def check_norm_flag(p: dict, problems: list[str]) -> None:
    need(p["norm"] in (0, 1), problems, f"norm={p['norm']} must be 0 or 1")


def matvec(w: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """w: [n, K] (any float dtype), v: [K] f32 -> [n] f32, accumulated in f32."""
    return w.float() @ v


def check_row_tile(p: dict, n: int, k: int, problems: list[str], name: str = "w") -> None:
    need(p["nrows"] >= 1, problems, f"nrows={p['nrows']} must be >= 1")
    need(p["nrows"] <= MAX_TILE_ROWS, problems, f"nrows={p['nrows']} exceeds tile capacity {MAX_TILE_ROWS}")
    need(0 <= p["row0"] and p["row0"] + p["nrows"] <= n, problems,
         f"rows [{p['row0']}, {p['row0'] + p['nrows']}) outside {name} with {n} rows")
    need(k % 8 == 0, problems, f"{name} row length K={k} must be a multiple of 8")
    need(k <= MAX_K, problems, f"{name} row length K={k} exceeds capacity {MAX_K}")


def check_vec(shape, k: int, problems: list[str], name: str) -> None:
    need(tuple(shape) == (k,), problems, f"{name} has shape {tuple(shape)}, expected ({k},)")


def vector_len(shape, problems: list[str], name: str) -> int | None:
    """The length of a 1-D operand; None, with a problem, when it is not a vector."""
    if len(shape) == 1:
        return shape[0]
    problems.append(f"{name} must be a vector, has shape {tuple(shape)}")
    return None


def check_vec_rows(p: dict, n: int, problems: list[str], name: str = "a") -> None:
    """params row0, nrows: a non-empty range of a vector of n elements."""
    need(p["nrows"] >= 1 and 0 <= p["row0"] and p["row0"] + p["nrows"] <= n, problems,
         f"rows [{p['row0']}, {p['row0'] + p['nrows']}) outside {name} of {n} elements")


def tile_cost(p: dict, k: int, itemsize: int, nmats: int = 1) -> tuple[int, int]:
    n = p["nrows"] * nmats
    return n * k * itemsize + k * 4 + p["nrows"] * 4, 2 * n * k
