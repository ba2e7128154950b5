"""RMS_LINEAR: y[row0:row0+nrows] = W[row0:row0+nrows] @ rmsnorm(x, gamma).

Every normed projection (RMS_*) starts with the params row0, nrows, eps, norm (instructions/tiles.py):
norm 1 normalises x in its prologue (the fused RMSNorm); 0 takes x as normalised by an RMSNORM task,
the unfused ablation, and leaves gamma unread. y may be tagged (docs/ir.md): Qwen3's plain q/k tiles hand
their rows to ROPE / KV_APPEND that way."""
from megavm.instructions.spec import ACT, F32, PACKED, OpSpec, Slot, W
from megavm.instructions.tiles import (
    NORMED,
    RMS_PREWAIT,
    check_normed,
    gemv_shared,
    matvec,
    norm_input,
    normed_accesses,
    row_streams,
    tile,
    tile_cost,
)


def reference(p, ins, outs):
    x, g, w = ins
    r0, r1 = tile(p)
    outs[0][r0:r1] = matvec(w[r0:r1], norm_input(p, x, g))


SPEC = OpSpec(
    name="RMS_LINEAR", code=1, doc=__doc__,
    shared=lambda p, ins, outs: gemv_shared(ins[2].shape[1], p["nrows"], w=ins[2]),
    inputs=(Slot("x", ACT, F32, tagged=True), Slot("gamma", W), Slot("w", W, PACKED)),
    outputs=(Slot("y", ACT, F32, tagged=True),),
    params=NORMED,
    check=check_normed, accesses=normed_accesses, reference=reference, streams=row_streams,
    cost=lambda p, ins, outs: tile_cost(p, ins[2]), prewait=RMS_PREWAIT,
)
