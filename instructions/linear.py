"""LINEAR: y[b, rows] = act(W[rows] @ x[b] + bias[rows] + mult * res[b, rows]) for the tile's batch
rows b: the generic fused epilogue. bias and res are optional; act is one of the activation codes
(instructions/activations.py). x and y are vectors (one batch row) or [batch, features] matrices.

The unfused ablation's o/down projections are LINEAR tiles with neither bias nor residual (an ADD
task adds the stream); DLRM's MLP layers are LINEAR tiles with bias and relu or sigmoid over a batch.
A tile of one batch row streams its weight rows through the loader ring ahead of its wait; a tile of
several reads them itself after the wait (the rows are reread once per batch row, from L2)."""
import math

from megavm.instructions.activations import ACT_CODE, activate, check_act
from megavm.instructions.batch import B0, NB, check_batch_rows
from megavm.instructions.spec import ACT, F32, INP, Access, OpSpec, Param, Slot, W, need
from megavm.instructions.tiles import (NROWS, ROW0, check_matrix, check_row_tile, gemv_shared, row_streams, tile,
                                      tile_accesses)

MULT = Param("mult", "the residual's multiplier (unread without a residual)", f32=True)


def _batch(b) -> int | None:
    """Batch rows of a vector (1) or a [batch, features] matrix."""
    return 1 if len(b.shape) == 1 else b.shape[0] if len(b.shape) == 2 else None


def check(p, ins, outs):
    probs = []
    x, w, bias, res = ins
    y = outs[0]
    if not check_matrix(w, probs):
        return probs
    n, k = w.shape
    nb = _batch(x)
    if nb is None or x.shape[-1] != k:
        probs.append(f"x has shape {x.shape}, expected ({k},) or (batch, {k})")
        return probs
    want_y = (n,) if len(x.shape) == 1 else (nb, n)
    need(y.shape == want_y, probs, f"y has shape {y.shape}, expected {want_y}")
    if bias is not None:
        need(bias.shape == (n,), probs, f"bias has shape {bias.shape}, expected ({n},)")
    if res is not None:
        need(res.shape == want_y, probs, f"res has shape {res.shape}, expected {want_y}")
    check_batch_rows(p, nb, probs)
    need(math.isfinite(p["mult"]), probs, f"mult={p['mult']} must be finite")
    check_row_tile(p, w, probs)
    check_act(p, probs)
    return probs


def _box(b, p, cols: tuple[int, int]):
    """The tile's region of a vector or [batch, features] operand: its batch rows, then cols."""
    return (cols,) if len(b.shape) == 1 else ((p["b0"], p["b0"] + p["nb"]), cols)


def accesses(p, ins, outs):
    x, w, bias, res = ins
    r = tile(p)
    acc = [Access("in", 0, _box(x, p, (0, x.shape[-1]))), *tile_accesses(p, 1, w), Access("out", 0, _box(outs[0], p, r))]
    if bias is not None:
        acc.append(Access("in", 2, (r,)))
    if res is not None:
        acc.append(Access("in", 3, _box(res, p, r)))
    return acc


def reference(p, ins, outs):
    x, w, bias, res = ins
    y = outs[0]
    r0, r1 = tile(p)
    b0, b1 = p["b0"], p["b0"] + p["nb"]
    as2 = (lambda t: t.unsqueeze(0)) if x.dim() == 1 else (lambda t: t)
    v = as2(x)[b0:b1].float() @ w[r0:r1].float().T                  # [nb, nrows], f32
    if bias is not None:
        v = v + bias[r0:r1].float()
    if res is not None:
        v = v + p["mult"] * as2(res)[b0:b1, r0:r1].float()
    as2(y)[b0:b1, r0:r1] = activate(p["act"], v)


def streams(p, ins, outs):
    return row_streams(p, ins, outs, slots=(1,)) if p["nb"] == 1 else []


def cost(p, ins, outs):
    x, w, bias, res = ins
    k, nr, nb = w.shape[1], p["nrows"], p["nb"]
    extra = (nr * bias.dtype.itemsize if bias is not None else 0) + (nb * nr * 4 if res is not None else 0)
    return nr * k * w.dtype.itemsize + nb * k * 4 + nb * nr * 4 + extra, 2 * nb * nr * k


SPEC = OpSpec(
    name="LINEAR", code=11, doc=__doc__,
    shared=lambda p, ins, outs: gemv_shared(ins[1].shape[1], p["nrows"], w=ins[1]),
    inputs=(Slot("x", ACT + INP, F32), Slot("w", W), Slot("bias", W, optional=True),
            Slot("res", ACT + INP, F32, optional=True)),
    outputs=(Slot("y", ACT, F32),),
    params=(ROW0, NROWS, B0, NB, ACT_CODE, MULT),
    check=check, accesses=accesses, reference=reference, streams=streams, cost=cost,
)
