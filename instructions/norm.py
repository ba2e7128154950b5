"""RMSNORM: y = gamma * x / rms(x) over the whole vector, in f32: the unfused ablation of the RMSNorm
that every RMS_* projection otherwise recomputes in its prologue (their param norm=0 then)."""
from instructions.common import MAX_K, check_vec, rms_normed, vector_len
from instructions.spec import ACT, W, Access, Op, OpSpec, Slot, full, need
from schedule.ir import DType


def check(p, ins, outs):
    probs = []
    k = vector_len(ins[0], probs, "x")
    if k is None:
        return probs
    check_vec(ins[1], k, probs, "gamma")
    check_vec(outs[0], k, probs, "y")
    need(k % 8 == 0, probs, f"x length {k} must be a multiple of 8")
    need(k <= MAX_K, probs, f"x length {k} exceeds capacity {MAX_K}")
    need(p["eps"] > 0, probs, f"eps={p['eps']} must be > 0")
    return probs


def reference(p, ins, outs):
    x, g = ins
    outs[0][:] = rms_normed(x, g, p["eps"])


SPEC = OpSpec(
    op=Op.RMSNORM,
    inputs=(Slot("x", ACT, (DType.F32,)), Slot("gamma", W)),
    outputs=(Slot("y", ACT, (DType.F32,)),),
    params=("eps",), float_params=frozenset({"eps"}),
    check=check,
    accesses=lambda p, i, o: [Access("in", 0, full(i[0])), Access("in", 1, full(i[1])), Access("out", 0, full(o[0]))],
    reference=reference, streams=lambda p, ins: [],
    cost=lambda p, ins, isz: (ins[0][0] * (4 + isz[1] + 4), 3 * ins[0][0]),
)
