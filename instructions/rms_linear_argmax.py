"""RMS_LINEAR_ARGMAX: an LM-head tile, rmsnorm then W[rows] @ x, writing its logits and a (max, index)
partial into best[tile] for ARGMAX. Ties go to the lowest index, as torch.argmax does."""
import torch

from megavm.instructions.spec import ACT, F32, PACKED, Access, OpSpec, Param, Slot, W, need
from megavm.instructions.tiles import (
    NORMED,
    RMS_PREWAIT,
    check_normed,
    gemv_shared,
    matvec,
    norm_input,
    normed_accesses,
    row_streams,
    tile,
    tile_cost,
)


def check(p, ins, outs):
    probs = check_normed(p, ins, outs)
    best = outs[1].shape
    need(len(best) == 2 and best[1] == 2, probs, f"best has shape {best}, expected (tiles, 2)")
    if len(best) == 2:
        need(0 <= p["tile"] < best[0], probs, f"tile={p['tile']} outside {best[0]} partial slots")
    return probs


def reference(p, ins, outs):
    x, g, w = ins
    r0, r1 = tile(p)
    y = matvec(w[r0:r1], norm_input(p, x, g))
    outs[0][r0:r1] = y
    i = int(torch.argmax(y))
    outs[1][p["tile"], 0] = y[i]
    outs[1][p["tile"], 1] = float(r0 + i)


SPEC = OpSpec(
    name="RMS_LINEAR_ARGMAX", code=8, doc=__doc__,
    shared=lambda p, ins, outs: gemv_shared(ins[2].shape[1], p["nrows"], w=ins[2]),
    inputs=(Slot("x", ACT, F32, tagged=True), Slot("gamma", W), Slot("w", W, PACKED)),
    outputs=(Slot("logits", ACT, F32), Slot("best", ACT, F32)),
    params=NORMED + (Param("tile", "the tile's slot in best, where it writes its (max, index) partial"),),
    check=check,
    accesses=lambda p, i, o: normed_accesses(p, i, o) + [Access("out", 1, ((p["tile"], p["tile"] + 1), (0, 2)))],
    reference=reference, streams=row_streams,
    cost=lambda p, ins, outs: tile_cost(p, ins[2]), prewait=RMS_PREWAIT,
)
