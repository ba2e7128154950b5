"""Row tiles of a weight matrix, what every GEMV opcode shares: the params row0/nrows, the shape
checks, the regions and weight streams of a tile, its cost; and the RMSNorm prologue of the normed
(RMS_*) opcodes, whose params eps/norm say whether they normalise x themselves."""
from __future__ import annotations

import torch

from megavm.core.limits import CONSUMER_THREADS, E2M1_F8, MAX_K, MAX_TILE_ROWS, U4_IMMA, U4_IMMA_LONG, U4_TAB_AHEAD
from megavm.core.types import Buffer, DType
from megavm.instructions.lora import add_shared
from megavm.instructions.spec import Access, Hook, Param, Stream, full, need, rows

ROW0 = Param("row0", "first output row of the tile (for vector opcodes: of the range they read)")
NROWS = Param("nrows", f"rows of the tile, at most {MAX_TILE_ROWS} (for vector opcodes: of the range)")
EPS = Param("eps", "RMSNorm epsilon", f32=True)
NORM = Param("norm", "1: normalise x in the prologue (the fused RMSNorm); 0: x arrives normalised by an "
                     "RMSNORM task and gamma is unread (the fusion ablation)")
NORMED = (ROW0, NROWS, EPS, NORM)          # the params every RMS_* opcode starts with
RMS_PREWAIT = Hook("rms_prewait", ("norm", "gamma", "w"))   # gamma into shared memory before the wait


def rms_normed(x: torch.Tensor, gamma: torch.Tensor, eps: float, dim: int | None = None) -> torch.Tensor:
    """x: [K] f32 -> gamma * x / rms(x), in f32; with dim, over that axis of x alone."""
    xf = x.float()
    ms = xf.pow(2).mean() if dim is None else xf.pow(2).mean(dim, keepdim=True)
    return gamma.float() * (xf * torch.rsqrt(ms + eps))


def rstd(x: torch.Tensor, eps: float) -> torch.Tensor:
    """1 / rms(x) of a vector, in f32: what a normed projection scales x by."""
    return torch.rsqrt(x.float().pow(2).mean() + eps)


def norm_input(p: dict, x: torch.Tensor, gamma: torch.Tensor) -> torch.Tensor:
    """What a normed projection multiplies: rmsnorm(x, gamma) when its `norm` param is 1, else x."""
    return rms_normed(x, gamma, p["eps"]) if p["norm"] else x.float()


def matvec(w: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """w: [n, K] (any float dtype), v: [K] f32 -> [n] f32, accumulated in f32."""
    return w.float() @ v


def tile(p: dict) -> tuple[int, int]:
    return p["row0"], p["row0"] + p["nrows"]


# the GEMV's per-warp row sums, at the top of xs: the most a build holds (gemv_core.cuh: PART_FLOATS), and
# the longest row the register path takes (REG_MAX_K; longer rows take the row-per-warp path, which has none)
def row_sums(nrows: int) -> int:
    """Floats of the register path's per-warp sums of a tile of nrows rows (a consumer warp's row each)."""
    return CONSUMER_THREADS // 32 * nrows


PART_FLOATS = row_sums(MAX_TILE_ROWS)
REG_MAX_K = MAX_K - PART_FLOATS


def u4_tab_ring(k: int) -> int:
    """Floats of xs the integer tensor-core path's group-table ring takes at K = k (gemv_imma.cuh): MVM_U4_TAB_AHEAD
    + 1 slots of each warp's 16 rows x K / 256 bytes (0 with the knob 0)."""
    return (U4_TAB_AHEAD + 1) * k // 8 if U4_TAB_AHEAD else 0


def tc_shared(w: Buffer | None, k: int, nrows: int, consumes_x: bool = False) -> int:
    """Floats of xs the default build's 4-bit tensor-core paths may take for a tile of a 2-D weight of K = 2048
    or 4096 and at least their fewest rows (0 where neither takes it): an E2M1 weight's e4m3 path
    (instructions/gemv_f8.cuh: e2m1_f8_takes; MVM_E2M1_F8 rows) x, B's fragments and the block scales' rings
    (K floats each) and the warps' factors; a U4 weight's integer path (gemv_imma.cuh: u4_imma_form; MVM_U4_IMMA
    rows) x, B's fragments, each group's sx and sum of x (K / 64) and the group tables' ring (u4_tab_ring); both
    below the whole per-warp sums. Held by the build sized to the program, so that the tile takes the same path,
    and computes the same bits, on every build of the default knobs. (gemv_xreg takes NVFP4's K = 2048 first:
    holding the e4m3 path's room there too keeps a build with MVM_XREG changed alike.) consumes_x: the opcode is
    done with x after its GEMV (LINEAR_RESIDUAL), so a U4 tile of MVM_U4_IMMA_LONG to 64 rows of K a multiple of
    2048 past 4096 takes the integer path with B in x's place: K + K / 64 floats, its row sums in acc."""
    if w is None or len(w.shape) != 2 or nrows > MAX_TILE_ROWS:
        return 0
    if k in (2048, 4096):
        if w.dtype == DType.E2M1 and E2M1_F8 and nrows >= E2M1_F8:
            return 3 * k + CONSUMER_THREADS // 32 + PART_FLOATS
        if w.dtype == DType.U4 and U4_IMMA and nrows >= U4_IMMA:
            return 2 * k + k // 64 + u4_tab_ring(k) + PART_FLOATS
    elif (consumes_x and w.dtype == DType.U4 and U4_IMMA_LONG and k > 4096 and k % 2048 == 0
          and U4_IMMA_LONG <= nrows <= 2 * MAX_TILE_ROWS // (CONSUMER_THREADS // 32)):
        return k + k // 64
    return 0


def gemv_shared(k: int, nrows: int, lora_b: Buffer | None = None, halves: int = 1, w: Buffer | None = None) -> int:
    """Floats of xs a GEMV task of nrows rows uses (OpSpec.shared): its activation vector of K (the packed
    formats' runs of it, gemv_core.cuh: xs_index, lie within K) and the register path's per-warp row sums
    of its rows (consumer warps x nrows, at the top of xs; none past REG_MAX_K); with LoRA's B (lora_b,
    `halves` groups of rows) the most of that and what its consumer side uses after the GEMV; with the
    weight w, what tc_shared holds for its tensor-core paths."""
    n = max(k + row_sums(nrows) if k <= REG_MAX_K else k, tc_shared(w, k, nrows))
    return n if lora_b is None else max(n, add_shared(lora_b, nrows, halves))


# -- checks -------------------------------------------------------------------------------------
def check_matrix(w: Buffer, problems: list[str], name: str = "w") -> bool:
    need(len(w.shape) == 2, problems, f"{name} must be 2-D, has shape {w.shape}")
    return len(w.shape) == 2


def check_row_tile(p: dict, w: Buffer, problems: list[str], name: str = "w") -> None:
    n, k = w.shape
    need(p["nrows"] >= 1, problems, f"nrows={p['nrows']} must be >= 1")
    need(p["nrows"] <= MAX_TILE_ROWS, problems, f"nrows={p['nrows']} exceeds tile capacity {MAX_TILE_ROWS}")
    need(0 <= p["row0"] and p["row0"] + p["nrows"] <= n, problems,
         f"rows [{p['row0']}, {p['row0'] + p['nrows']}) outside {name} with {n} rows")
    need(k % 8 == 0, problems, f"{name} row length K={k} must be a multiple of 8")
    need(k <= MAX_K, problems, f"{name} row length K={k} exceeds capacity {MAX_K}")


def check_vec(b: Buffer, k: int, problems: list[str], name: str) -> None:
    need(b.shape == (k,), problems, f"{name} has shape {b.shape}, expected ({k},)")


def vector_len(b: Buffer, problems: list[str], name: str) -> int | None:
    """The length of a 1-D operand; None, with a problem, when it is not a vector."""
    if len(b.shape) == 1:
        return b.shape[0]
    problems.append(f"{name} must be a vector, has shape {b.shape}")
    return None


def check_vec_rows(p: dict, n: int, problems: list[str], name: str = "a") -> None:
    """params row0, nrows: a non-empty range of a vector of n elements."""
    need(p["nrows"] >= 1 and 0 <= p["row0"] and p["row0"] + p["nrows"] <= n, problems,
         f"rows [{p['row0']}, {p['row0'] + p['nrows']}) outside {name} of {n} elements")


def check_normed(p: dict, ins: list[Buffer], outs: list[Buffer], out_rows: bool = True) -> list[str]:
    """An RMS_* tile: inputs (x, gamma, w, ...); with out_rows, outputs[0] is a vector of w's rows."""
    probs: list[str] = []
    x, g, w = ins[:3]
    if not check_matrix(w, probs):
        return probs
    n, k = w.shape
    check_vec(x, k, probs, "x")
    check_vec(g, k, probs, "gamma")
    check_row_tile(p, w, probs)
    need(p["eps"] > 0, probs, f"eps={p['eps']} must be > 0")
    need(p["norm"] in (0, 1), probs, f"norm={p['norm']} must be 0 or 1")
    if out_rows:
        check_vec(outs[0], n, probs, "y")
    return probs


# -- regions, streams, cost ---------------------------------------------------------------------
def tile_accesses(p: dict, w_slot: int, w: Buffer) -> list[Access]:
    """The weight rows of the tile (the activation operands are declared by each opcode)."""
    return [Access("in", w_slot, (tile(p), (0, w.shape[1])))]


def normed_accesses(p: dict, ins: list[Buffer], outs: list[Buffer]) -> list[Access]:
    """x and gamma whole, the tile's rows of w, the tile's rows of output 0."""
    return [Access("in", 0, full(ins[0].shape)), Access("in", 1, full(ins[1].shape)),
            *tile_accesses(p, 2, ins[2]), Access("out", 0, rows(*tile(p)))]


def row_streams(p: dict, ins: list[Buffer], outs: list[Buffer], slots: tuple[int, ...] = (2,)) -> list[Stream]:
    """The tile's rows of each weight operand in slots, one stream each."""
    return [Stream(s, p["row0"] * ins[s].shape[1], p["nrows"] * ins[s].shape[1]) for s in slots]


def tile_cost(p: dict, w: Buffer, nmats: int = 1) -> tuple[int, int]:
    k, n = w.shape[1], p["nrows"] * nmats
    return n * k * w.dtype.itemsize + k * 4 + p["nrows"] * 4, 2 * n * k
