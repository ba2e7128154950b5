"""The q/k/v projection tiles' epilogue before RoPE, in the order the model classes apply it: the
projection's bias (Qwen2), then a per-head RMSNorm with its own weight (Qwen3's q_norm and k_norm).
Both are optional slots of RMS_LINEAR_ROPE and RMS_LINEAR_KV, and of ROPE and KV_APPEND, which finish
rows another task projected (how Qwen3's q/k tiles of any height get their whole-head norm); the rows
are in interleaved RoPE order, and so are the bias and the norm weight (schedule/weights.py permutes
them alike)."""
from __future__ import annotations

import torch

from megavm.core.types import Buffer
from megavm.core.limits import MAX_TILE_ROWS
from megavm.instructions.lora import adapter_id, check_consume, low_rank
from megavm.instructions.rotary import check_pairs, check_pos_freqs
from megavm.instructions.spec import Access, Hook, Param, Slot, W, full, need, rows
from megavm.instructions.tiles import matvec, norm_input, rms_normed, rstd, tile

EPILOGUE = (Slot("bias", W, optional=True), Slot("head_norm", W, optional=True))
# ROPE and KV_APPEND: the head norm's epsilon (the RMS_* opcodes have theirs in NORMED)
# their head norm's weight, RoPE frequencies and bias into shared memory before the wait
FINISH_PREWAIT = Hook("finish_prewait", ("row0", "nrows", "head_dim", "freqs", "bias", "head_norm"))
HEAD_EPS = Param("eps", "the head norm's epsilon (read when head_norm is present)", f32=True, default=0.0)


def check_epilogue(p: dict, bias: Buffer | None, head_norm: Buffer | None, n: int, problems: list[str]) -> None:
    """bias: one value per row of w (n rows); head_norm: head_dim values, the tile whole heads."""
    hd = p["head_dim"]
    if bias is not None:
        need(bias.shape == (n,), problems, f"bias has shape {bias.shape}, expected ({n},)")
    if head_norm is not None:
        need(head_norm.shape == (hd,), problems, f"head_norm has shape {head_norm.shape}, expected ({hd},)")
        need(p["row0"] % hd == 0 and p["nrows"] % hd == 0, problems,
             f"rows [{p['row0']}, {p['row0'] + p['nrows']}) must be whole heads of {hd} for a head norm")


def check_finish(p: dict, bias: Buffer | None, head_norm: Buffer | None, n: int, problems: list[str]) -> None:
    """ROPE / KV_APPEND with an epilogue: as check_epilogue, and the rows fit one tile (they are
    finished in shared memory, the way the projection tiles finish theirs)."""
    check_epilogue(p, bias, head_norm, n, problems)
    if bias is not None or head_norm is not None:
        need(p["nrows"] <= MAX_TILE_ROWS, problems,
             f"nrows={p['nrows']} over {MAX_TILE_ROWS} for rows with a bias or head norm")


def epilogue_accesses(p: dict, ins: list, first: int) -> list[Access]:
    """The bias rows and the whole norm weight, for the slots that are present (bias at `first`)."""
    out = []
    if ins[first] is not None:
        out.append(Access("in", first, rows(*tile(p))))
    if ins[first + 1] is not None:
        out.append(Access("in", first + 1, full(ins[first + 1].shape)))
    return out


def epilogue(p: dict, y: torch.Tensor, bias, head_norm) -> torch.Tensor:
    """y: [nrows] f32, rows row0.. of the projection -> with its bias, then each head normalised."""
    r0, r1 = tile(p)
    if bias is not None:
        y = y + bias[r0:r1].float()
    if head_norm is not None:
        y = rms_normed(y.view(-1, p["head_dim"]), head_norm, p["eps"], dim=-1).reshape(-1)
    return y


def tile_rows(p: dict, ins: list) -> torch.Tensor:
    """A q/k/v tile's rows before RoPE (RMS_LINEAR_ROPE, RMS_LINEAR_KV, RMS_LINEAR_AMAX; their inputs x,
    gamma, w, pos, freqs, bias, head_norm, lora_u, lora_b, adapter): rmsnorm, W[rows] @ x plus the LoRA
    term, then the bias and head norm."""
    x, g, w, _, _, bias, head_norm, lu, lb = ins[:9]
    r0, r1 = tile(p)
    acc = matvec(w[r0:r1], norm_input(p, x, g)) + low_rank(p, lu, lb, adapter_id(ins, 9), r0, r1 - r0,
                                                           rstd(x, p["eps"]), p["lora_off"])
    return epilogue(p, acc, bias, head_norm)


def check_tile_inputs(p: dict, ins: list[Buffer], problems: list[str], rope: bool) -> None:
    """A q/k/v tile's operands after x, gamma and w (ins as tile_rows's): pos and freqs, whole RoPE
    pairs when it rotates, its bias and head norm, its LoRA operands."""
    check_pos_freqs(p, ins[3], ins[4], problems)
    if rope:
        check_pairs(p, problems)
    if len(ins[2].shape) == 2:
        check_epilogue(p, ins[5], ins[6], ins[2].shape[0], problems)
        check_consume(p, ins[7], ins[8], ins[9], ins[2].shape[0], problems, normed=p["norm"] == 1)
