"""EXPERT_GLU: h[slot, rows] = act(Wg[e][rows] @ n) * (Wu[e][rows] @ n) for the expert e = ids[slot]
a ROUTE task chose, n = rmsnorm(x, gamma): the gate and up projections of one chosen expert, one tile
of its rows. With limit > 0 (DeepSeek-V4's swiglu_limit) the gate is clamped above at limit and the
up projection to [-limit, limit] before they meet. The loader streams the expert's rows as soon as
the ids are written (late-bound streams). h may be tagged (docs/ir.md): EXPERT_DOWN polls its words instead
of waiting on the GLU tiles' counter."""

from megavm.core.limits import MAX_TILE_ROWS
from megavm.instructions.activations import ACT_CODE, LIMIT, activate, check_act
from megavm.instructions.experts import check_stack, expert_stream, stack_box
from megavm.instructions.spec import ACT, F32, PACKED, I32, Access, Hook, OpSpec, Param, Slot, W, full, need
from megavm.instructions.tiles import NORMED, check_vec, gemv_shared, matvec, norm_input

def check(p, ins, outs):
    probs = []
    x, g, wg, wu, ids = ins
    h = outs[0]
    if not check_stack(p, wg, ids, probs, "wg"):
        return probs
    need(wu.shape == wg.shape, probs, f"wu {wu.shape} and wg {wg.shape} must be equal shapes")
    e, f, d = wg.shape
    check_vec(x, d, probs, "x")
    check_vec(g, d, probs, "gamma")
    need(2 * p["nrows"] <= MAX_TILE_ROWS, probs, f"nrows={p['nrows']}: gate and up rows exceed tile capacity "
                                                 f"{MAX_TILE_ROWS}")
    need(p["eps"] > 0 and p["norm"] in (0, 1), probs, f"eps={p['eps']} must be > 0 and norm={p['norm']} 0 or 1")
    need(len(ids.shape) == 1 and h.shape == (ids.shape[0], f), probs,
         f"h has shape {h.shape}, expected (k, {f}) for the k={ids.shape[0] if ids.shape else '?'} chosen experts")
    need(0 <= p["slot"] < (ids.shape[0] if ids.shape else 0), probs, f"slot={p['slot']} outside the ids")
    need(p["limit"] >= 0, probs, f"limit={p['limit']} must be >= 0 (0: no clamp)")
    check_act(p, probs)
    return probs

def accesses(p, ins, outs):
    j, r0, r1 = p["slot"], p["row0"], p["row0"] + p["nrows"]
    return [Access("in", 0, full(ins[0].shape)), Access("in", 1, full(ins[1].shape)),
            Access("in", 2, stack_box(p, ins[2])), Access("in", 3, stack_box(p, ins[3])),
            Access("in", 4, ((j, j + 1),)), Access("out", 0, ((j, j + 1), (r0, r1)))]

def reference(p, ins, outs):
    x, g, wg, wu, ids = ins
    j, r0, r1 = p["slot"], p["row0"], p["row0"] + p["nrows"]
    e = int(ids[j])
    if not 0 <= e < wg.shape[0]:
        raise ValueError(f"expert id {e} at slot {j} outside the {wg.shape[0]} experts")
    n = norm_input(p, x, g)
    gate, up = matvec(wg[e, r0:r1], n), matvec(wu[e, r0:r1], n)
    if p["limit"] > 0:
        gate, up = gate.clamp(max=p["limit"]), up.clamp(-p["limit"], p["limit"])
    outs[0][j, r0:r1] = activate(p["act"], gate) * up

def cost(p, ins, outs):
    d = ins[2].shape[2]
    return 2 * p["nrows"] * d * ins[2].dtype.itemsize + d * 4 + p["nrows"] * 4, 4 * p["nrows"] * d

SPEC = OpSpec(
    name="EXPERT_GLU", code=18, doc=__doc__,
    inputs=(Slot("x", ACT, F32, tagged=True), Slot("gamma", W), Slot("wg", W, PACKED), Slot("wu", W, PACKED), Slot("ids", ACT, I32)),
    outputs=(Slot("h", ACT, F32, tagged=True),),
    params=NORMED + (ACT_CODE, Param("slot", "which chosen expert: the index into ids"), LIMIT),
    check=check, accesses=accesses, reference=reference, cost=cost,
    streams=lambda p, ins, outs: [expert_stream(p, ins[2], 2, 4, p["slot"], 1),
                                  expert_stream(p, ins[3], 3, 4, p["slot"], 1)],
    prewait=Hook("rms_prewait", ("norm", "gamma", "wg")),
    shared=lambda p, ins, outs: gemv_shared(ins[2].shape[2], p["nrows"]),
)
