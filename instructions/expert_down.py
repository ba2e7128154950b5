"""EXPERT_DOWN: y[rows] = res[rows] + Ws[rows] @ hs + sum over j < k of weights[j] * (Wd[ids[j]][rows] @
h[j]): the down projections of a shared expert (optional: hs, Ws) and of the k chosen experts, summed
into the residual stream, one tile of its rows. The sum runs in that order, the experts in slot order
j = 0, 1, ..., so results are bitwise reproducible. The loader streams the shared rows ahead of the
wait, and each chosen expert's rows as soon as the ids are written (one late-bound stream of k runs).
h, res and y may be tagged (docs/ir.md): the GLU tiles' h reaches the down tiles, and the residual stream the
next layer's tiles, by polled waits."""
from megavm.core.limits import MAX_TOPK
from megavm.instructions.experts import check_stack, expert_stream, stack_box
from megavm.instructions.spec import ACT, F32, PACKED, I32, Access, OpSpec, Slot, Stream, W, full, need, rows
from megavm.instructions.tiles import NROWS, PART_FLOATS, REG_MAX_K, ROW0, check_vec, matvec, row_sums


def check(p, ins, outs):
    probs = []
    h, wd, ids, weights, res, hs, ws = ins
    if not check_stack(p, wd, ids, probs, "wd"):
        return probs
    e, d, f = wd.shape
    k = ids.shape[0] if len(ids.shape) == 1 else 0
    need(h.shape == (k, f), probs, f"h has shape {h.shape}, expected ({k}, {f})")
    need(weights.shape == (k,), probs, f"weights has shape {weights.shape}, expected ({k},)")
    check_vec(res, d, probs, "res")
    check_vec(outs[0], d, probs, "y")
    need((hs is None) == (ws is None), probs, "a shared expert takes both h_shared and w_shared")
    if hs is not None and ws is not None:
        need(len(hs.shape) == 1 and ws.shape == (d, hs.shape[0]) and hs.shape[0] % 8 == 0, probs,
             f"h_shared {hs.shape} and w_shared {ws.shape} must be (F,) and ({d}, F), F a multiple of 8")
    return probs


def accesses(p, ins, outs):
    r = rows(p["row0"], p["row0"] + p["nrows"])
    out = [Access("in", 0, full(ins[0].shape)), Access("in", 1, stack_box(p, ins[1])),
           Access("in", 2, full(ins[2].shape)), Access("in", 3, full(ins[3].shape)), Access("in", 4, r),
           Access("out", 0, r)]
    if ins[5] is not None:
        out += [Access("in", 5, full(ins[5].shape)), Access("in", 6, (r[0], (0, ins[6].shape[1])))]
    return out


def streams(p, ins, outs):
    shared = [] if ins[6] is None else [Stream(6, p["row0"] * ins[6].shape[1], p["nrows"] * ins[6].shape[1])]
    return shared + [expert_stream(p, ins[1], 1, 2, 0, ins[2].shape[0])]


def reference(p, ins, outs):
    h, wd, ids, weights, res, hs, ws = ins
    r0, r1 = p["row0"], p["row0"] + p["nrows"]
    y = res[r0:r1].float().clone()
    if hs is not None:
        y += matvec(ws[r0:r1], hs.float())
    for j in range(ids.shape[0]):
        e = int(ids[j])
        if not 0 <= e < wd.shape[0]:
            raise ValueError(f"expert id {e} at slot {j} outside the {wd.shape[0]} experts")
        y += weights[j] * matvec(wd[e, r0:r1], h[j].float())
    outs[0][r0:r1] = y


def cost(p, ins, outs):
    k, f = ins[0].shape
    n = k * (p["nrows"] * f * ins[1].dtype.itemsize + f * 4) + 2 * p["nrows"] * 4
    fs = 0 if ins[5] is None else ins[5].shape[0]
    n += fs * (p["nrows"] * ins[1].dtype.itemsize + 4)
    return n, 2 * (k * f + fs) * p["nrows"]


def shared(p, ins, outs):
    """Floats of xs (expert_down.cuh): the k chosen experts' vectors, all at once where k F is at most
    REG_MAX_K, else one at a time, or the shared expert's, and the register path's sums of the tile's
    rows above them; at least the ids' and weights' slots below the most sums."""
    k, f = ins[0].shape
    vectors = max(k * f if k * f <= REG_MAX_K else f, 0 if ins[5] is None else ins[5].shape[0])
    return max(vectors + row_sums(p["nrows"]), PART_FLOATS + 2 * MAX_TOPK)


SPEC = OpSpec(
    name="EXPERT_DOWN", code=19, doc=__doc__,
    inputs=(Slot("h", ACT, F32, tagged=True), Slot("wd", W, PACKED), Slot("ids", ACT, I32), Slot("weights", ACT, F32),
            Slot("res", ACT, F32, tagged=True), Slot("h_shared", ACT, F32, optional=True), Slot("w_shared", W, PACKED, optional=True)),
    outputs=(Slot("y", ACT, F32, tagged=True),),
    params=(ROW0, NROWS),
    check=check, accesses=accesses, reference=reference, cost=cost, streams=streams, shared=shared,
)
