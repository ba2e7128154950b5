"""RMSNORM: y = gamma * x / rms(x) over the whole vector, in f32: the unfused ablation of the RMSNorm
that every RMS_* projection otherwise recomputes in its prologue (their param norm is 0 then)."""
from megavm.core.limits import MAX_K
from megavm.instructions.spec import ACT, F32, Access, OpSpec, Slot, W, full, need
from megavm.instructions.tiles import EPS, check_vec, rms_normed, vector_len


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
    name="RMSNORM", code=10, doc=__doc__,
    shared=lambda p, ins, outs: ins[0].shape[0],
    inputs=(Slot("x", ACT, F32), Slot("gamma", W)),
    outputs=(Slot("y", ACT, F32),),
    params=(EPS,),
    check=check,
    accesses=lambda p, i, o: [Access("in", 0, full(i[0].shape)), Access("in", 1, full(i[1].shape)),
                              Access("out", 0, full(o[0].shape))],
    reference=reference,
    cost=lambda p, ins, outs: (ins[0].shape[0] * (8 + ins[1].dtype.itemsize), 3 * ins[0].shape[0]),
)
