"""RMS_SWIGLU: h[rows] = silu(Wg[rows] @ n) * (Wu[rows] @ n), n = rmsnorm(x, gamma)."""
import torch

from instructions.common import check_norm_flag, check_row_tile, check_vec, matvec, norm_input, tile_cost
from instructions.spec import ACT, W, Access, Op, OpSpec, Slot, Stream, full, need, rows
from schedule.ir import DType


def check(p, ins, outs):
    probs = []
    x, g, wg, wu = ins
    need(len(wg) == 2 and tuple(wg) == tuple(wu), probs, f"wg {tuple(wg)} and wu {tuple(wu)} must be equal 2-D shapes")
    if probs:
        return probs
    n, k = wg
    check_vec(x, k, probs, "x")
    check_vec(g, k, probs, "gamma")
    check_vec(outs[0], n, probs, "h")
    check_row_tile(p, n, k, probs, "wg")
    need(2 * p["nrows"] <= 256, probs, f"nrows={p['nrows']}: gate+up rows exceed tile capacity 256")
    need(p["eps"] > 0, probs, f"eps={p['eps']} must be > 0")
    check_norm_flag(p, probs)
    return probs


def accesses(p, ins, outs):
    r0, r1 = p["row0"], p["row0"] + p["nrows"]
    k = ins[2][1]
    return [Access("in", 0, full(ins[0])), Access("in", 1, full(ins[1])),
            Access("in", 2, ((r0, r1), (0, k))), Access("in", 3, ((r0, r1), (0, k))), Access("out", 0, rows(r0, r1))]


def reference(p, ins, outs):
    x, g, wg, wu = ins
    r0, r1 = p["row0"], p["row0"] + p["nrows"]
    n = norm_input(p, x, g)
    outs[0][r0:r1] = torch.nn.functional.silu(matvec(wg[r0:r1], n)) * matvec(wu[r0:r1], n)


def streams(p, ins):
    k = ins[2][1]
    return [Stream(2, p["row0"] * k, p["nrows"] * k), Stream(3, p["row0"] * k, p["nrows"] * k)]


SPEC = OpSpec(
    op=Op.RMS_SWIGLU,
    inputs=(Slot("x", ACT, (DType.F32,)), Slot("gamma", W), Slot("wg", W), Slot("wu", W)),
    outputs=(Slot("h", ACT, (DType.F32,)),),
    params=("row0", "nrows", "eps", "norm"), float_params=frozenset({"eps"}),
    check=check, accesses=accesses, reference=reference, streams=streams,
    cost=lambda p, ins, isz: tile_cost(p, ins[2][1], isz[2], nmats=2),
)
