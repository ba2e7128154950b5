"""What the expert opcodes (EXPERT_GLU, EXPERT_DOWN) share: a stack of expert matrices [experts,
rows, K] read at the ids a ROUTE task of the same step wrote, its checks, regions and late-bound
weight streams. An expert stack is declared read whole along its expert axis (which experts run is
known only at run time); the bytes a task costs and streams are those of the chosen experts only."""
from __future__ import annotations

from megavm.core.limits import MAX_K, MAX_TILE_ROWS
from megavm.core.types import Buffer
from megavm.instructions.spec import Stream, need


def check_stack(p: dict, w: Buffer, ids: Buffer, problems: list[str], name: str) -> bool:
    """w: [experts, n, K] with the tile's rows [row0, row0 + nrows) inside n; ids: an i32 vector."""
    if len(w.shape) != 3:
        problems.append(f"{name} must be a stack [experts, rows, K], has shape {w.shape}")
        return False
    e, n, k = w.shape
    need(len(ids.shape) == 1 and 1 <= ids.shape[0] <= e, problems,
         f"ids has shape {ids.shape}: a vector of 1 to {e} expert ids")
    need(1 <= p["nrows"] <= MAX_TILE_ROWS, problems, f"nrows={p['nrows']} must be in [1, {MAX_TILE_ROWS}]")
    need(0 <= p["row0"] and p["row0"] + p["nrows"] <= n, problems,
         f"rows [{p['row0']}, {p['row0'] + p['nrows']}) outside {name} with {n} rows per expert")
    need(k % 8 == 0 and k <= MAX_K, problems, f"{name} row length K={k} must be a multiple of 8 up to {MAX_K}")
    return True


def stack_box(p: dict, w: Buffer) -> tuple:
    """The tile's rows of every expert: any of them may be the one chosen."""
    return ((0, w.shape[0]), (p["row0"], p["row0"] + p["nrows"]), (0, w.shape[2]))


def expert_stream(p: dict, w: Buffer, slot: int, ids_slot: int, first: int, count: int) -> Stream:
    """The tile's rows of the experts ids[first:first + count] of the stack at input slot `slot`."""
    k = w.shape[2]
    return Stream(slot, p["row0"] * k, p["nrows"] * k, index=(ids_slot, first, count))
