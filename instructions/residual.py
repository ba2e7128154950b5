"""LINEAR_RESIDUAL: y[rows] = res[rows] + W[rows] @ a (o-projection and down-projection).

a is an activation vector, or a 4-D buffer of attention partials [kv_heads, blocks, group, head_dim+2]
(see attention.py), which the opcode combines on load: the o-projection with ATTN_COMBINE fused in.

LINEAR (y[rows] = W[rows] @ a) and ADD (y[rows] = a[rows] + b[rows]) are the unfused pair, for the
residual-fusion ablation: the projection writes its own vector and one ADD task adds the stream.
"""
import torch

from instructions.attention import combine, combine_scratch
from instructions.common import MAX_K, check_row_tile, check_vec, check_vec_rows, matvec, tile_cost, vector_len
from instructions.spec import ACT, W, Access, Op, OpSpec, Slot, Stream, full, need, rows
from schedule.ir import DType


def check(p, ins, outs):
    probs = []
    a, w, res = ins
    need(len(w) == 2, probs, f"w must be 2-D, has shape {tuple(w)}")
    if probs:
        return probs
    n, k = w
    if len(a) == 4:
        nkv, _, g, width = a
        need(nkv * g * (width - 2) == k, probs, f"partials {tuple(a)} combine to {nkv * g * (width - 2)} values, "
                                                f"w has {k} columns")
        need(combine_scratch(a) <= MAX_K, probs, f"combining partials {tuple(a)} needs {combine_scratch(a)} floats "
                                                 f"of scratch, more than {MAX_K}")
    else:
        check_vec(a, k, probs, "a")
    check_vec(res, n, probs, "res")
    check_vec(outs[0], n, probs, "y")
    check_row_tile(p, n, k, probs)
    return probs


def accesses(p, ins, outs):
    r = rows(p["row0"], p["row0"] + p["nrows"])
    return [Access("in", 0, full(ins[0])), Access("in", 1, ((r[0]), (0, ins[1][1]))),
            Access("in", 2, r), Access("out", 0, r)]


def reference(p, ins, outs):
    a, w, res = ins
    if a.dim() == 4:
        a = torch.cat([combine(a[h]) for h in range(a.shape[0])])
    r0, r1 = p["row0"], p["row0"] + p["nrows"]
    outs[0][r0:r1] = res[r0:r1] + matvec(w[r0:r1], a.float())


SPEC = OpSpec(
    op=Op.LINEAR_RESIDUAL,
    inputs=(Slot("a", ACT, (DType.F32,)), Slot("w", W), Slot("res", ACT, (DType.F32,))),
    outputs=(Slot("y", ACT, (DType.F32,)),),
    params=("row0", "nrows"), float_params=frozenset(),
    check=check, accesses=accesses, reference=reference,
    streams=lambda p, ins: [Stream(1, p["row0"] * ins[1][1], p["nrows"] * ins[1][1])],
    cost=lambda p, ins, isz: tile_cost(p, ins[1][1], isz[1]),
)


def check_linear(p, ins, outs):
    probs = []
    a, w = ins
    need(len(w) == 2, probs, f"w must be 2-D, has shape {tuple(w)}")
    if probs:
        return probs
    n, k = w
    check_vec(a, k, probs, "a")
    check_vec(outs[0], n, probs, "y")
    check_row_tile(p, n, k, probs)
    return probs


def reference_linear(p, ins, outs):
    a, w = ins
    r0, r1 = p["row0"], p["row0"] + p["nrows"]
    outs[0][r0:r1] = matvec(w[r0:r1], a.float())


LINEAR = OpSpec(
    op=Op.LINEAR,
    inputs=(Slot("a", ACT, (DType.F32,)), Slot("w", W)),
    outputs=(Slot("y", ACT, (DType.F32,)),),
    params=("row0", "nrows"), float_params=frozenset(),
    check=check_linear,
    accesses=lambda p, i, o: [Access("in", 0, full(i[0])),
                              Access("in", 1, ((p["row0"], p["row0"] + p["nrows"]), (0, i[1][1]))),
                              Access("out", 0, rows(p["row0"], p["row0"] + p["nrows"]))],
    reference=reference_linear,
    streams=lambda p, ins: [Stream(1, p["row0"] * ins[1][1], p["nrows"] * ins[1][1])],
    cost=lambda p, ins, isz: tile_cost(p, ins[1][1], isz[1]),
)


def check_add(p, ins, outs):
    probs = []
    n = vector_len(ins[0], probs, "a")
    if n is None:
        return probs
    check_vec(ins[1], n, probs, "b")
    check_vec(outs[0], n, probs, "y")
    check_vec_rows(p, n, probs)
    return probs


def reference_add(p, ins, outs):
    a, b = ins
    r0, r1 = p["row0"], p["row0"] + p["nrows"]
    outs[0][r0:r1] = a[r0:r1] + b[r0:r1]


ADD = OpSpec(
    op=Op.ADD,
    inputs=(Slot("a", ACT, (DType.F32,)), Slot("b", ACT, (DType.F32,))),
    outputs=(Slot("y", ACT, (DType.F32,)),),
    params=("row0", "nrows"), float_params=frozenset(),
    check=check_add,
    accesses=lambda p, i, o: [Access(io, s, rows(p["row0"], p["row0"] + p["nrows"]))
                              for io, s in (("in", 0), ("in", 1), ("out", 0))],
    reference=reference_add, streams=lambda p, ins: [],
    cost=lambda p, ins, isz: (12 * p["nrows"], p["nrows"]),
)
