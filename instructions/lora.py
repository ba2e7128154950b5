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

from megavm.core.limits import CONSUMER_THREADS, MAX_K
from megavm.core.types import Buffer
from megavm.instructions.spec import ACT, F32, I32, INP, Access, Param, Slot, W, full, need

ADAPTER = "adapter id"

# the consumer side: the partial products of its input, its B, the adapter id
CONSUME = (Slot("lora_u", ACT, F32, optional=True, tagged=True), Slot("lora_b", W, optional=True),
           Slot("adapter", INP, I32, role=ADAPTER, bound=("lora_b", 0), optional=True))
LORA_OFF = Param("lora_off", "first column of lora_u this projection's A rows fill (0 without LoRA)", default=0)

# the producer side: A of the projections its output feeds, and where the partial products go
NEXT_A = Slot("next_a", W, optional=True)
NEXT_U = Slot("next_u", ACT, F32, optional=True, tagged=True)
PRODUCE_ID = Slot("adapter", INP, I32, role=ADAPTER, bound=("next_a", 0), optional=True)
NEXT_G = Slot("next_gamma", W, optional=True)       # the RMSNorm weight of normed next projections
LORA_T = Param("lora_t", "row of next_u this task writes (0 without LoRA)", default=0)


def add_shared(b: Buffer, nrows: int, halves: int = 1) -> int:
    """Floats of xs the consumer side uses once its GEMV is done (lora.cuh: lora_add_rows): the producers'
    partial sums [chunks, C] and u [C] (C = halves x rank), then the tile's rows of B staged, where they
    fit the whole xs (the kernel stages them only then: a build sized to the program stages them too)."""
    c = halves * b.shape[2]
    base = (max(1, CONSUMER_THREADS // c) * c + c + 3) & ~3
    stage = -(-halves * nrows * b.shape[2] * b.dtype.itemsize // 4)
    return base + stage if base + stage <= MAX_K else base


def adapter_id(ins: list, slot: int) -> int:
    """The step's adapter id from the operand at slot (0 when the slot is empty)."""
    return 0 if ins[slot] is None else int(ins[slot][0])


# -- checks ---------------------------------------------------------------------------------------
def check_consume(p: dict, u: Buffer | None, b: Buffer | None, aid: Buffer | None, rows: int, problems: list[str],
                  normed: bool | None = None, halves: int = 1) -> None:
    """u [producers, columns], b [adapters, rows * halves, rank] and the id together, or u and b absent
    (the id may stand alone: the task's producer side reads it)."""
    if u is None and b is None:
        need(p["lora_off"] == 0, problems, f"lora_off={p['lora_off']} without LoRA operands")
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
def consume_accesses(ins: list, first: int) -> list[Access]:
    """Every partial product (the sum is over all producers), B and the id, when present."""
    if ins[first] is None:
        return []
    return [Access("in", first, full(ins[first].shape)), Access("in", first + 1, full(ins[first + 1].shape)),
            Access("in", first + 2, full(ins[first + 2].shape))]


def produce_accesses(p: dict, ins: list, outs: list, a_slot: int, id_slot: int, u_out: int,
                     g_slot: int | None = None) -> list[Access]:
    if ins[a_slot] is None:
        return []
    g = [Access("in", g_slot, full(ins[g_slot].shape))] if g_slot is not None and ins[g_slot] is not None else []
    return [Access("in", a_slot, full(ins[a_slot].shape)), Access("in", id_slot, full(ins[id_slot].shape)), *g,
            Access("out", u_out, ((p["lora_t"], p["lora_t"] + 1), (0, outs[u_out].shape[1])))]


# -- the torch reference --------------------------------------------------------------------------
def low_rank(p: dict, u: torch.Tensor | None, b: torch.Tensor | None, aid: int, row0: int, nrows: int,
             s: float | torch.Tensor = 1.0, col: int = 0) -> torch.Tensor | float:
    """B[id, row0:row0 + nrows] @ (s * sum_t u[t, col:col + rank]), f32; 0 without LoRA or for id 0."""
    if u is None or aid == 0:
        return 0.0
    rank = b.shape[2]
    v = u[:, col:col + rank].float().sum(0) * s
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


def consume_cost(b: Buffer | None, u: Buffer | None, nrows: int) -> int:
    return 0 if b is None else nrows * b.shape[2] * b.dtype.itemsize + u.shape[0] * b.shape[2] * 4

