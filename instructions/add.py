"""ADD: y[rows] = a[rows] + b[rows], in that order (the f32 sums LINEAR_RESIDUAL's epilogue makes):
the residual add of the unfused ablation."""
from megavm.instructions.spec import ACT, F32, Access, OpSpec, Slot, rows
from megavm.instructions.tiles import NROWS, ROW0, check_vec, check_vec_rows, tile, vector_len


def check(p, ins, outs):
    probs = []
    n = vector_len(ins[0], probs, "a")
    if n is None:
        return probs
    check_vec(ins[1], n, probs, "b")
    check_vec(outs[0], n, probs, "y")
    check_vec_rows(p, n, probs)
    return probs


def reference(p, ins, outs):
    a, b = ins
    r0, r1 = tile(p)
    outs[0][r0:r1] = a[r0:r1] + b[r0:r1]


SPEC = OpSpec(
    name="ADD", code=12, doc=__doc__,
    shared=lambda p, ins, outs: 0,
    inputs=(Slot("a", ACT, F32), Slot("b", ACT, F32)),
    outputs=(Slot("y", ACT, F32),),
    params=(ROW0, NROWS),
    check=check,
    accesses=lambda p, i, o: [Access(io, s, rows(*tile(p))) for io, s in (("in", 0), ("in", 1), ("out", 0))],
    reference=reference,
    cost=lambda p, ins, outs: (12 * p["nrows"], p["nrows"]),
)
