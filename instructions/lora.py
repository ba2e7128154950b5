"""LoRA adapters inside the projections: y = W v + B_id (A_id v), never merged into W, the adapter id a
runtime input of each step (0: none). The stacked weights hold every loaded adapter at its id (slot 0
zeros), the rank padded with zeros to the largest and the scale folded into B; A holds the adapter's
values as they are (a normed projection's RMSNorm weight is applied by the producer, next_gamma).

A v needs all of v, which several tasks write a part of. By default a few LORA_A tasks a group compute it
once v is whole (instructions/lora_a.py: each some rows of A over all of v, lora_u [1, columns]); with
ScheduleConfig.lora_a_tasks=False, or where a row of A and v do not fit a LORA_A task's shared memory,
the product is split where v is made: a task that writes rows of a projection's input (the producer:
EMBED, ATTN_COMBINE, the o and down tiles of LINEAR_RESIDUAL, RMS_GLU) also writes its partial product,
    next_u[t, j] = sum over its rows r of A[id, j, r] g[r] v[r]     (row t of next_u is this task's;
                                                                   g: next_gamma, or 1)
Either way a projection tile (the consumer: RMS_LINEAR_ROPE, RMS_LINEAR_KV, LINEAR_RESIDUAL, RMS_GLU),
which waits for the writers of lora_u, adds the low-rank term to its rows before its epilogue,
    acc[r] += sum_j B[id, row0 + r, j] u[j],   u[j] = s * sum_t lora_u[t, lora_off + j]
with s = 1 / rms(x) for a normed projection (its norm weight g is in the partials) and 1 otherwise. The adapter's
bytes are read once per step.
"""
from __future__ import annotations

import torch

from megavm.core.limits import MAX_K
from megavm.core.types import Buffer, DType
from megavm.instructions.spec import ACT, F32, I32, INP, Access, Param, Slot, W, full, need

ADAPTER = "adapter id"

# the consumer side: the partial products of its input, its B, the adapter id
CONSUME = (Slot("lora_u", ACT, F32, optional=True, tagged=True), Slot("lora_b", W, optional=True),
           Slot("adapter", INP, I32, role=ADAPTER, bound=("lora_b", 0), optional=True))
# the in-tile form: the consumer's own rows of its group's A, multiplied by the x it already holds (no lora_u)
SELF_A = Slot("lora_a", W, optional=True)
LORA_OFF = Param("lora_off", "first column of lora_u this projection's A rows fill (0 without LoRA)", default=0)

# the producer side: A of the projections its output feeds, and where the partial products go
NEXT_A = Slot("next_a", W, optional=True)
NEXT_U = Slot("next_u", ACT, F32, optional=True, tagged=True)
PRODUCE_ID = Slot("adapter", INP, I32, role=ADAPTER, bound=("next_a", 0), optional=True)
NEXT_G = Slot("next_gamma", W, optional=True)       # the RMSNorm weight of normed next projections
LORA_T = Param("lora_t", "row of next_u this task writes (0 without LoRA)", default=0)


def adapter_id(ins: list, slot: int) -> int:
    """The step's adapter id from the operand at slot (0 when the slot is empty)."""
    return 0 if ins[slot] is None else int(ins[slot][0])


# -- checks ---------------------------------------------------------------------------------------
def check_consume(p: dict, u: Buffer | None, b: Buffer | None, aid: Buffer | None, rows: int, problems: list[str],
                  normed: bool | None = None, halves: int = 1, a: Buffer | None = None,
                  w: Buffer | None = None) -> None:
    """u [producers, columns] (or the in-tile form's a [adapters, columns, K], K w's columns),
    b [adapters, rows * halves, rank] and the id together, or all absent (the id may stand alone: the task's
    producer side reads it)."""
    if u is None and b is None and a is None:
        need(p["lora_off"] == 0, problems, f"lora_off={p['lora_off']} without LoRA operands")
        return
    if u is not None and a is not None:
        problems.append("lora_u and lora_a exclude each other: the partial products, or the tile's own A")
        return
    if a is not None:
        check_self_a(p, a, b, aid, w, rows, halves, problems)
        return
    if u is None or b is None or aid is None:
        problems.append("lora_u, lora_b and adapter go together: give all three or none")
        return
    need(len(u.shape) == 2, problems, f"lora_u must be [producers, columns], has shape {u.shape}")
    need(len(b.shape) == 3 and b.shape[1] == rows * halves, problems,
         f"lora_b has shape {b.shape}, expected (adapters, {rows * halves}, rank)")
    need(aid.shape == (1,), problems, f"adapter has shape {aid.shape}, expected (1,)")
    if len(u.shape) == 2 and len(b.shape) == 3:
        need(0 <= p["lora_off"] and p["lora_off"] + halves * b.shape[2] <= u.shape[1], problems,
             f"lora_u columns [{p['lora_off']}, {p['lora_off'] + halves * b.shape[2]}) outside its {u.shape[1]}")
    if normed is not None:
        need(normed, problems, "LoRA on a normed projection needs norm=1 (its partials hold the norm weight)")


def check_self_a(p: dict, a: Buffer, b: Buffer | None, aid: Buffer | None, w: Buffer | None, rows: int, halves: int,
                 problems: list[str]) -> None:
    """The in-tile form: a [adapters, columns, K] in w's dtype (bf16 or f32: x is in shared memory as their
    GEMVs leave it), its columns lora_off .. + halves * rank, K a multiple of 8 whose x, u and B's rows fit
    the block's MAX_K floats of shared memory."""
    if b is None or aid is None or w is None:
        problems.append("lora_a, lora_b and adapter go together (and a weight w)")
        return
    need(len(b.shape) == 3 and b.shape[1] == rows * halves, problems,
         f"lora_b has shape {b.shape}, expected (adapters, {rows * halves}, rank)")
    need(aid.shape == (1,), problems, f"adapter has shape {aid.shape}, expected (1,)")
    K = w.shape[-1]
    need(len(a.shape) == 3 and a.shape[2] == K, problems, f"lora_a has shape {a.shape}, expected (adapters, columns, {K})")
    need(a.dtype == w.dtype and w.dtype in (DType.BF16, DType.F32), problems,
         f"lora_a ({a.dtype.name}) reads x as a {w.dtype.name} GEMV leaves it: both bf16 or both f32")
    need(K % 8 == 0, problems, f"lora_a's rows of {K} must be a multiple of 8")
    if len(a.shape) == 3 and len(b.shape) == 3:
        need(a.shape[0] == b.shape[0], problems, f"lora_a holds {a.shape[0]} adapters, lora_b {b.shape[0]}")
        C = halves * b.shape[2]
        need(0 <= p["lora_off"] and p["lora_off"] + C <= a.shape[1], problems,
             f"lora_a rows [{p['lora_off']}, {p['lora_off'] + C}) outside its {a.shape[1]}")
        need(K + C + 8 <= MAX_K, problems, f"x ({K}) and u ({C}) exceed the {MAX_K} floats of shared memory")


def check_produce(p: dict, a: Buffer | None, u: Buffer | None, aid: Buffer | None, length: int,
                  problems: list[str], gamma: Buffer | None = None) -> None:
    """a [adapters, columns, length of the produced vector], u [producers, columns] and the id together,
    or a and u absent (the id may stand alone: the task's consumer side reads it)."""
    if a is None and u is None:
        need(p["lora_t"] == 0, problems, f"lora_t={p['lora_t']} without LoRA operands")
        need(gamma is None, problems, "next_gamma without next_a")
        return
    if gamma is not None:
        need(gamma.shape == (length,), problems, f"next_gamma has shape {gamma.shape}, expected ({length},)")
    if a is None or u is None or aid is None:
        problems.append("next_a, next_u and adapter go together: give all three or none")
        return
    need(len(a.shape) == 3 and a.shape[2] == length, problems,
         f"next_a has shape {a.shape}, expected (adapters, columns, {length})")
    need(len(u.shape) == 2 and len(a.shape) == 3 and u.shape[1] == a.shape[1], problems,
         f"next_u has shape {u.shape}, expected (producers, {a.shape[1] if len(a.shape) == 3 else '?'})")
    need(aid.shape == (1,), problems, f"adapter has shape {aid.shape}, expected (1,)")
    if len(u.shape) == 2:
        need(0 <= p["lora_t"] < u.shape[0], problems, f"lora_t={p['lora_t']} outside next_u's {u.shape[0]} rows")


# -- regions --------------------------------------------------------------------------------------
def consume_accesses(ins: list, first: int, a_slot: int) -> list[Access]:
    """Every partial product (the sum is over all producers) or the tile's own A, B and the id, when present."""
    out = [Access("in", k, full(ins[k].shape)) for k in (first, a_slot) if ins[k] is not None]
    if not out:
        return []
    return out + [Access("in", first + 1, full(ins[first + 1].shape)), Access("in", first + 2, full(ins[first + 2].shape))]


def produce_accesses(p: dict, ins: list, outs: list, a_slot: int, id_slot: int, u_out: int,
                     g_slot: int | None = None) -> list[Access]:
    if ins[a_slot] is None:
        return []
    g = [Access("in", g_slot, full(ins[g_slot].shape))] if g_slot is not None and ins[g_slot] is not None else []
    return [Access("in", a_slot, full(ins[a_slot].shape)), Access("in", id_slot, full(ins[id_slot].shape)), *g,
            Access("out", u_out, ((p["lora_t"], p["lora_t"] + 1), (0, outs[u_out].shape[1])))]


# -- the torch reference --------------------------------------------------------------------------
def low_rank(p: dict, u: torch.Tensor | None, b: torch.Tensor | None, aid: int, row0: int, nrows: int,
             s: float | torch.Tensor = 1.0, col: int = 0, a: torch.Tensor | None = None,
             x: torch.Tensor | None = None) -> torch.Tensor | float:
    """B[id, row0:row0 + nrows] @ (s * sum_t u[t, col:col + rank]), or in the in-tile form (a, the tile's
    own A) B[id, rows] @ (A[id, col:col + rank] @ x), x what the tile's GEMV multiplies (normed where it
    is); f32; 0 without LoRA or for id 0."""
    if (u is None and a is None) or aid == 0:
        return 0.0
    rank = b.shape[2]
    v = a[aid, col:col + rank].float() @ x if a is not None else u[:, col:col + rank].float().sum(0) * s
    return b[aid, row0:row0 + nrows].float() @ v


def produce(p: dict, a: torch.Tensor | None, u: torch.Tensor | None, aid: int, v: torch.Tensor, col0: int,
            gamma: torch.Tensor | None = None) -> None:
    """next_u[lora_t] = A[id, :, col0:col0 + len(v)] @ (g v) (f32; g: gamma's elements there, or 1; not
    written for id 0, which no one reads)."""
    if a is None or aid == 0:
        return
    v = v.float() if gamma is None else gamma[col0:col0 + v.numel()].float() * v.float()
    u[p["lora_t"]] = a[aid, :, col0:col0 + v.numel()].float() @ v


def produce_cost(p: dict, a: Buffer | None, n: int) -> int:
    return 0 if a is None else a.shape[1] * n * a.dtype.itemsize + a.shape[1] * 4


def consume_cost(b: Buffer | None, u: Buffer | None, nrows: int, a: Buffer | None = None, halves: int = 1) -> int:
    if b is None:
        return 0
    mine = halves * b.shape[2] * a.shape[2] * a.dtype.itemsize if a is not None else u.shape[0] * b.shape[2] * 4
    return nrows * b.shape[2] * b.dtype.itemsize + mine

