"""LINEAR: y[rows] = W[rows] @ a, the o/down projection tiles without the residual add: the unfused
ablation, whose ADD task adds the residual stream."""
from megavm.instructions.spec import ACT, F32, Access, OpSpec, Slot, W, full, rows
from megavm.instructions.tiles import (
    NROWS,
    ROW0,
    check_matrix,
    check_row_tile,
    check_vec,
    matvec,
    row_streams,
    tile,
    tile_accesses,
    tile_cost,
)


def check(p, ins, outs):
    probs = []
    a, w = ins
    if not check_matrix(w, probs):
        return probs
    n, k = w.shape
    check_vec(a, k, probs, "a")
    check_vec(outs[0], n, probs, "y")
    check_row_tile(p, w, probs)
    return probs


def reference(p, ins, outs):
    a, w = ins
    r0, r1 = tile(p)
    outs[0][r0:r1] = matvec(w[r0:r1], a.float())


SPEC = OpSpec(
    name="LINEAR", code=11, doc=__doc__,
    inputs=(Slot("a", ACT, F32), Slot("w", W)),
    outputs=(Slot("y", ACT, F32),),
    params=(ROW0, NROWS),
    check=check,
    accesses=lambda p, i, o: [Access("in", 0, full(i[0].shape)), *tile_accesses(p, 1, i[1]),
                              Access("out", 0, rows(*tile(p)))],
    reference=reference,
    streams=lambda p, ins, outs: row_streams(p, ins, outs, slots=(1,)),
    cost=lambda p, ins, outs: tile_cost(p, ins[1]),
)
