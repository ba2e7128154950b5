"""RMS_GLU: h[rows] = act(Wg[rows] @ n) * (Wu[rows] @ n), n = rmsnorm(x, gamma): the gate and up
projections of a gated MLP in one tile (act silu: SwiGLU; gelu_tanh: Gemma's GeGLU)."""
from megavm.core.limits import MAX_TILE_ROWS
from megavm.instructions.activations import ACT_CODE, activate, check_act
from megavm.instructions.spec import ACT, F32, Access, Hook, OpSpec, Slot, W, full, need, rows
from megavm.instructions.tiles import (
    NORMED,
    check_normed,
    matvec,
    norm_input,
    row_streams,
    tile,
    tile_accesses,
    tile_cost,
)


def check(p, ins, outs):
    probs = []
    wg, wu = ins[2], ins[3]
    need(wg.shape == wu.shape, probs, f"wg {wg.shape} and wu {wu.shape} must be equal shapes")
    probs += check_normed(p, ins, outs)
    need(2 * p["nrows"] <= MAX_TILE_ROWS, probs,
         f"nrows={p['nrows']}: gate and up rows exceed tile capacity {MAX_TILE_ROWS}")
    check_act(p, probs)
    return probs


def accesses(p, ins, outs):
    return [Access("in", 0, full(ins[0].shape)), Access("in", 1, full(ins[1].shape)),
            *tile_accesses(p, 2, ins[2]), *tile_accesses(p, 3, ins[3]), Access("out", 0, rows(*tile(p)))]


def reference(p, ins, outs):
    x, g, wg, wu = ins
    r0, r1 = tile(p)
    n = norm_input(p, x, g)
    outs[0][r0:r1] = activate(p["act"], matvec(wg[r0:r1], n)) * matvec(wu[r0:r1], n)


SPEC = OpSpec(
    name="RMS_GLU", code=4, doc=__doc__,
    inputs=(Slot("x", ACT, F32), Slot("gamma", W), Slot("wg", W), Slot("wu", W)),
    outputs=(Slot("h", ACT, F32),),
    params=NORMED + (ACT_CODE,),
    check=check, accesses=accesses, reference=reference,
    streams=lambda p, ins, outs: row_streams(p, ins, outs, slots=(2, 3)),
    cost=lambda p, ins, outs: tile_cost(p, ins[2], nmats=2), prewait=Hook("rms_prewait", ("norm", "gamma", "wg")),
)
