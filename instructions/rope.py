"""ROPE: y[rows] = rows of a, with their bias and per-head norm where present (instructions/qkv.py),
rotated at position pos (instructions/rotary.py): the unfused form of RMS_LINEAR_ROPE's epilogue, and
the task that finishes q tiles too short for a whole-head norm (Qwen3's q_norm)."""
from megavm.instructions.qkv import EPILOGUE, FINISH_PREWAIT, HEAD_EPS, check_finish, epilogue, epilogue_accesses
from megavm.instructions.rotary import HEAD_DIM, check_pairs, check_pos_freqs, check_vector_range, rotate_pairs
from megavm.instructions.spec import ACT, F32, I32, INP, POSITION, Access, OpSpec, Slot, W, full, rows
from megavm.instructions.tiles import NROWS, ROW0, check_vec, tile


def check(p, ins, outs):
    probs = []
    n = check_vector_range(p, ins[0], probs)
    check_pairs(p, probs, "ranges")
    check_pos_freqs(p, ins[1], ins[2], probs)
    if n is not None:
        check_vec(outs[0], n, probs, "y")
        check_finish(p, ins[3], ins[4], n, probs)
    return probs


def reference(p, ins, outs):
    a, pos, freqs, bias, head_norm = ins
    r0, r1 = tile(p)
    y = epilogue(p, a[r0:r1].float(), bias, head_norm)
    outs[0][r0:r1] = rotate_pairs(y, r0, p["head_dim"], int(pos[0]), freqs)


SPEC = OpSpec(
    name="ROPE", code=13, doc=__doc__,
    shared=lambda p, ins, outs: 2 * p["head_dim"] + p["nrows"],
    inputs=(Slot("a", ACT, F32, tagged=True), Slot("pos", INP, I32, role=POSITION), Slot("freqs", W, F32)) + EPILOGUE,
    outputs=(Slot("y", ACT, F32, tagged=True),),
    params=(ROW0, NROWS, HEAD_DIM, HEAD_EPS),
    check=check,
    accesses=lambda p, i, o: [Access("in", 0, rows(*tile(p))), Access("in", 1, full(i[1].shape)),
                              Access("in", 2, full(i[2].shape)), Access("out", 0, rows(*tile(p)))]
                             + epilogue_accesses(p, i, 3),
    reference=reference, prewait=FINISH_PREWAIT,
    cost=lambda p, ins, outs: (8 * p["nrows"], 6 * p["nrows"]),
)
