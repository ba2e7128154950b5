"""LORA_A: some rows of a LoRA group's down product, u[0, row0:row0+nrows] = A[id, row0:row0+nrows] (g v), over
the whole input vector v of the group's projections (the layer's x, the attention output, mid or the GLU
output), g its RMSNorm weight or 1. The group's projection tiles read u (instructions/lora.py); nothing is
written for id 0. The task's rows of A are copied into shared memory before its wait (kept in L2 from step
to step), and g with them, so after the wait only v's words and the dot products remain: off the chain as long as they
land before the projections' GEMVs end (docs/ir.md, "LoRA adapters")."""
from megavm.core.limits import MAX_K
from megavm.instructions.lora import ADAPTER, adapter_id
from megavm.instructions.spec import ACT, F32, I32, INP, Access, Hook, OpSpec, Param, Slot, W, full, need
from megavm.instructions.tiles import vector_len


def fits(nrows: int, length: int, itemsize: int) -> bool:
    """nrows rows of A (of length elements) and the length floats of v together in the block's MAX_K floats of
    shared memory."""
    return nrows * length * itemsize + 4 * length <= 4 * MAX_K


def check(p, ins, outs):
    probs = []
    v, a, aid, gamma = ins
    u = outs[0]
    L = vector_len(v, probs, "v")
    if L is None:
        return probs
    need(len(a.shape) == 3 and a.shape[2] == L, probs, f"a has shape {a.shape}, expected (adapters, rows, {L})")
    need(aid.shape == (1,), probs, f"adapter has shape {aid.shape}, expected (1,)")
    if gamma is not None:
        need(gamma.shape == (L,), probs, f"gamma has shape {gamma.shape}, expected ({L},)")
    if probs:
        return probs
    J = a.shape[1]
    need(u.shape == (1, J), probs, f"u has shape {u.shape}, expected (1, {J})")
    r0, n = p["row0"], p["nrows"]
    need(n >= 1 and r0 >= 0 and r0 + n <= J, probs, f"rows [{r0}, {r0 + n}) outside a's {J}")
    need(L % 8 == 0, probs, f"v length {L} must be a multiple of 8")
    need(fits(n, L, a.dtype.itemsize), probs,
         f"{n} rows of a of {L} elements and v exceed the {4 * MAX_K} bytes of shared memory")
    return probs


def accesses(p, ins, outs):
    g = [Access("in", 3, full(ins[3].shape))] if ins[3] is not None else []
    return [Access("in", 0, full(ins[0].shape)), Access("in", 1, full(ins[1].shape)),
            Access("in", 2, full(ins[2].shape)), *g, Access("out", 0, ((0, 1), (p["row0"], p["row0"] + p["nrows"])))]


def reference(p, ins, outs):
    v, a, _, gamma = ins
    aid = adapter_id(ins, 2)
    if aid == 0:
        return
    r0, r1 = p["row0"], p["row0"] + p["nrows"]
    x = v.float() if gamma is None else gamma.float() * v.float()
    outs[0][0, r0:r1] = a[aid, r0:r1].float() @ x


SPEC = OpSpec(
    name="LORA_A", code=23, doc=__doc__,
    inputs=(Slot("v", ACT, F32, tagged=True), Slot("a", W), Slot("adapter", INP, I32, role=ADAPTER, bound=("a", 0)),
            Slot("gamma", W, optional=True)),
    outputs=(Slot("u", ACT, F32, tagged=True),),
    params=(Param("row0", "first row of a the task multiplies"), Param("nrows", "rows of a it multiplies")),
    check=check, accesses=accesses, reference=reference,
    cost=lambda p, ins, outs: (p["nrows"] * ins[1].shape[2] * ins[1].dtype.itemsize + 8 * ins[0].shape[0],
                               2 * p["nrows"] * ins[1].shape[2]),
    prewait=Hook("lora_a_prewait", ("a", "adapter", "gamma", "row0", "nrows")),
    # xs (lora_a.cuh): the task's rows of A, then v
    shared=lambda p, ins, outs: -(-p["nrows"] * ins[1].shape[2] * ins[1].dtype.itemsize // 4) + ins[1].shape[2],
)
