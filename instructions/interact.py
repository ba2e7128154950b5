"""INTERACT: y[b] = [z[b], <t_i, t_j> for i > j, 0 ...] for the tile's batch rows b, where t_0 = z[b]
and t_1.. = e[b, 0..]: DLRM's pairwise dot-product interaction (no self-interaction), pairs in the
order i = 1.., j = 0..i-1, then zeros to y's width (the next layer's rows are padded to a multiple of
8 columns)."""
import torch

from megavm.core.limits import MAX_K
from megavm.instructions.batch import B0, NB, batch_rows, check_batch_rows
from megavm.instructions.spec import ACT, F32, Access, OpSpec, Slot, need


def pairs(n: int) -> tuple[list[int], list[int]]:
    """(i, j) of the strictly lower triangle of an n x n matrix, row by row."""
    li = [i for i in range(n) for _ in range(i)]
    lj = [j for i in range(n) for j in range(i)]
    return li, lj


def width(n_sparse: int, dim: int) -> int:
    """The interaction's values: the dense vector and one dot per pair of the 1 + n_sparse vectors."""
    return dim + (n_sparse + 1) * n_sparse // 2


def check(p, ins, outs):
    probs = []
    z, e = ins
    y = outs[0]
    need(len(z.shape) == 2, probs, f"z must be [batch, dim], has shape {z.shape}")
    need(len(e.shape) == 3, probs, f"e must be [batch, features, dim], has shape {e.shape}")
    if probs:
        return probs
    B, D = z.shape
    S = e.shape[1]
    need(e.shape == (B, S, D), probs, f"e has shape {e.shape}, expected ({B}, features, {D})")
    w = width(S, D)
    need(len(y.shape) == 2 and y.shape[0] == B and y.shape[1] >= w, probs,
         f"y has shape {y.shape}, expected ({B}, >= {w})")
    need((S + 1) * D <= MAX_K, probs, f"{S + 1} vectors of {D} exceed the {MAX_K} floats of shared memory")
    check_batch_rows(p, B, probs, "z")
    return probs


def reference(p, ins, outs):
    z, e = ins
    y = outs[0]
    b0, b1 = batch_rows(p)
    t = torch.cat([z[b0:b1, None], e[b0:b1]], dim=1).float()          # [nb, 1 + S, D]
    li, lj = pairs(t.shape[1])
    dots = torch.bmm(t, t.transpose(1, 2))[:, li, lj]
    D = z.shape[1]
    y[b0:b1] = 0
    y[b0:b1, :D] = z[b0:b1]
    y[b0:b1, D:D + len(li)] = dots


def accesses(p, ins, outs):
    r = batch_rows(p)
    return [Access("in", 0, (r, (0, ins[0].shape[1]))), Access("in", 1, (r, (0, ins[1].shape[1]), (0, ins[1].shape[2]))),
            Access("out", 0, (r, (0, outs[0].shape[1])))]


def cost(p, ins, outs):
    S1, D = ins[1].shape[1] + 1, ins[0].shape[1]
    return 4 * p["nb"] * (S1 * D + outs[0].shape[1]), p["nb"] * S1 * (S1 - 1) * D


SPEC = OpSpec(
    name="INTERACT", code=16, doc=__doc__,
    inputs=(Slot("z", ACT, F32), Slot("e", ACT, F32)),
    outputs=(Slot("y", ACT, F32),),
    params=(B0, NB),
    check=check, accesses=accesses, reference=reference, cost=cost,
    shared=lambda p, ins, outs: (ins[1].shape[1] + 1) * ins[0].shape[1],   # a batch row's 1 + S vectors
)
