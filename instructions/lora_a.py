"""LORA_A: one slice of a LoRA group's down product, u[lora_t] = A[id, :, col0:col0+ncols] (g v)[col0:col0+ncols],
from the whole input vector v of the group's projections (the layer's x, the attention output, mid or the
GLU output), g its RMSNorm weight or 1. The group's projection tiles sum the slices (instructions/lora.py);
nothing is written for id 0. The slice of A is copied into shared memory before the wait, so only v's
arrival and the few dot products remain after it: off the chain as long as it lands before the
projections' GEMVs end (docs/ir.md, "LoRA adapters")."""
from megavm.core.limits import MAX_K
from megavm.instructions.lora import ADAPTER, LORA_T, adapter_id, check_produce, produce
from megavm.instructions.spec import ACT, F32, I32, INP, Access, Hook, OpSpec, Param, Slot, W, full, need, rows
from megavm.instructions.tiles import vector_len


def fits(rows_a: int, ncols: int, itemsize: int) -> bool:
    """The slice of A (rows_a x ncols) and the ncols of v together in the block's MAX_K floats of shared memory."""
    return -(-rows_a * ncols * itemsize // 16) * 16 + 4 * ncols <= 4 * MAX_K


def check(p, ins, outs):
    probs = []
    v, a, aid, gamma = ins
    L = vector_len(v, probs, "v")
    if L is None:
        return probs
    check_produce(p, a, outs[0], aid, L, probs, gamma)
    if probs:
        return probs
    c0, n = p["col0"], p["ncols"]
    need(n >= 8 and c0 >= 0 and c0 + n <= L, probs, f"cols [{c0}, {c0 + n}) outside v of {L} elements")
    need(c0 % 8 == 0 and n % 8 == 0, probs, f"col0={c0} and ncols={n} must be multiples of 8")
    need(fits(a.shape[1], n, a.dtype.itemsize), probs,
         f"a slice of {a.shape[1]} x {n} and its {n} inputs exceed the {4 * MAX_K} bytes of shared memory")
    return probs


def accesses(p, ins, outs):
    c0, c1, t = p["col0"], p["col0"] + p["ncols"], p["lora_t"]
    g = [Access("in", 3, full(ins[3].shape))] if ins[3] is not None else []
    return [Access("in", 0, rows(c0, c1)), Access("in", 1, full(ins[1].shape)), Access("in", 2, full(ins[2].shape)),
            *g, Access("out", 0, ((t, t + 1), (0, outs[0].shape[1])))]


def reference(p, ins, outs):
    v, a, aid, gamma = ins
    c0, c1 = p["col0"], p["col0"] + p["ncols"]
    produce(p, a, outs[0], adapter_id(ins, 2), v[c0:c1], c0, gamma)


SPEC = OpSpec(
    name="LORA_A", code=23, doc=__doc__,
    inputs=(Slot("v", ACT, F32, tagged=True), Slot("a", W), Slot("adapter", INP, I32, role=ADAPTER, bound=("a", 0)),
            Slot("gamma", W, optional=True)),
    outputs=(Slot("u", ACT, F32, tagged=True),),
    params=(Param("col0", "first element of v the task multiplies"), Param("ncols", "elements of v it multiplies"),
            LORA_T),
    check=check, accesses=accesses, reference=reference,
    cost=lambda p, ins, outs: (ins[1].shape[1] * p["ncols"] * ins[1].dtype.itemsize + 4 * p["ncols"],
                               2 * ins[1].shape[1] * p["ncols"]),
    prewait=Hook("lora_a_prewait", ("a", "adapter", "col0", "ncols")),
)
