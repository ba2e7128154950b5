"""Batch tiles: the params b0/nb of opcodes that run over the rows of a [batch, ...] operand, and
their checks and regions."""
from __future__ import annotations

from megavm.instructions.spec import Param, need

B0 = Param("b0", "first batch row of the tile (0 for vectors)")
NB = Param("nb", "batch rows of the tile (1 for vectors)")


def check_batch_rows(p: dict, batch: int, problems: list[str], name: str = "x") -> None:
    need(p["nb"] >= 1 and 0 <= p["b0"] and p["b0"] + p["nb"] <= batch, problems,
         f"batch rows [{p['b0']}, {p['b0'] + p['nb']}) outside {name}'s {batch}")


def batch_rows(p: dict) -> tuple[int, int]:
    return p["b0"], p["b0"] + p["nb"]
