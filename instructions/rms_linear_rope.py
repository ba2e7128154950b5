"""RMS_LINEAR_ROPE: the query projection tile, rmsnorm then W[rows] @ x, then its epilogue: the bias
and per-head norm where present (instructions/qkv.py), and RoPE at position pos (instructions/rotary.py:
rows in interleaved pairs)."""
from megavm.instructions.qkv import EPILOGUE, check_epilogue, epilogue, epilogue_accesses
from megavm.instructions.rotary import HEAD_DIM, check_pairs, check_pos_freqs, rotate_pairs
from megavm.instructions.spec import ACT, F32, I32, INP, POSITION, Access, OpSpec, Slot, W, full
from megavm.instructions.tiles import (
    NORMED,
    RMS_PREWAIT,
    check_normed,
    matvec,
    norm_input,
    normed_accesses,
    row_streams,
    tile,
    tile_cost,
)


def check(p, ins, outs):
    probs = check_normed(p, ins, outs)
    check_pairs(p, probs)
    check_pos_freqs(p, ins[3], ins[4], probs)
    if len(ins[2].shape) == 2:
        check_epilogue(p, ins[5], ins[6], ins[2].shape[0], probs)
    return probs


def reference(p, ins, outs):
    x, g, w, pos, freqs, bias, head_norm = ins
    r0, r1 = tile(p)
    y = epilogue(p, matvec(w[r0:r1], norm_input(p, x, g)), bias, head_norm)
    outs[0][r0:r1] = rotate_pairs(y, r0, p["head_dim"], int(pos[0]), freqs)


SPEC = OpSpec(
    name="RMS_LINEAR_ROPE", code=2, doc=__doc__,
    inputs=(Slot("x", ACT, F32), Slot("gamma", W), Slot("w", W), Slot("pos", INP, I32, role=POSITION),
            Slot("freqs", W, F32)) + EPILOGUE,
    outputs=(Slot("y", ACT, F32),),
    params=NORMED + (HEAD_DIM,),
    check=check,
    accesses=lambda p, i, o: normed_accesses(p, i, o) + [Access("in", 3, full(i[3].shape)),
                                                         Access("in", 4, full(i[4].shape))] + epilogue_accesses(p, i, 5),
    reference=reference, streams=row_streams,
    cost=lambda p, ins, outs: tile_cost(p, ins[2]), prewait=RMS_PREWAIT,
)
