"""RMS_LINEAR: y[row0:row0+nrows] = W[row0:row0+nrows] @ rmsnorm(x, gamma).

Every normed projection (RMS_*) carries the param `norm`: 1 normalises x in its prologue (the fused
RMSNorm); 0 takes x as already normalised by an RMSNORM task (instructions/norm.py), the unfused
ablation, and leaves gamma unread."""
from instructions.common import check_norm_flag, check_row_tile, check_vec, matvec, norm_input, tile_cost
from instructions.spec import ACT, W, Access, Op, OpSpec, Slot, Stream, full, need, rows
from schedule.ir import DType


def check_norm_linear(p, ins, outs, out_len=None):
    probs = []
    x, g, w = ins[0], ins[1], ins[2]
    need(len(w) == 2, probs, f"w must be 2-D, has shape {tuple(w)}")
    if len(w) != 2:
        return probs
    n, k = w
    check_vec(x, k, probs, "x")
    check_vec(g, k, probs, "gamma")
    check_row_tile(p, n, k, probs)
    need(p["eps"] > 0, probs, f"eps={p['eps']} must be > 0")
    check_norm_flag(p, probs)
    if out_len is not None:
        check_vec(outs[0], out_len, probs, "y")
    return probs


def norm_linear_accesses(p, ins, outs):
    r = rows(p["row0"], p["row0"] + p["nrows"])
    return [Access("in", 0, full(ins[0])), Access("in", 1, full(ins[1])),
            Access("in", 2, ((p["row0"], p["row0"] + p["nrows"]), (0, ins[2][1]))), Access("out", 0, r)]


def row_stream(p, ins, slot=2):
    k = ins[slot][1]
    return [Stream(slot, p["row0"] * k, p["nrows"] * k)]


def reference(p, ins, outs):
    x, g, w = ins
    r0, r1 = p["row0"], p["row0"] + p["nrows"]
    outs[0][r0:r1] = matvec(w[r0:r1], norm_input(p, x, g))


SPEC = OpSpec(
    op=Op.RMS_LINEAR,
    inputs=(Slot("x", ACT, (DType.F32,)), Slot("gamma", W), Slot("w", W)),
    outputs=(Slot("y", ACT, (DType.F32,)),),
    params=("row0", "nrows", "eps", "norm"), float_params=frozenset({"eps"}),
    check=lambda p, i, o: check_norm_linear(p, i, o, i[2][0] if len(i[2]) == 2 else None),
    accesses=norm_linear_accesses, reference=reference, streams=row_stream,
    cost=lambda p, ins, isz: tile_cost(p, ins[2][1], isz[2]),
)
