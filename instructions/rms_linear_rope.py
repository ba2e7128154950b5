"""RMS_LINEAR_ROPE: the query projection tile, rmsnorm then W[rows] @ x (plus its LoRA term where
present, instructions/lora.py), then its epilogue: the bias and per-head norm where present
(instructions/qkv.py), and RoPE at position pos (instructions/rotary.py: rows in interleaved pairs)."""
from megavm.instructions.lora import CONSUME, LORA_OFF, consume_accesses, consume_cost
from megavm.instructions.qkv import EPILOGUE, check_tile_inputs, epilogue_accesses, tile_rows
from megavm.instructions.rotary import HEAD_DIM, rotate_pairs
from megavm.instructions.spec import ACT, F32, PACKED, I32, INP, POSITION, Access, OpSpec, Slot, W, full
from megavm.instructions.tiles import (NORMED, RMS_PREWAIT, check_normed, gemv_shared, normed_accesses, row_streams,
                                      tile, tile_cost)


def check(p, ins, outs):
    probs = check_normed(p, ins, outs)
    check_tile_inputs(p, ins, probs, rope=True)
    return probs


def reference(p, ins, outs):
    r0, r1 = tile(p)
    outs[0][r0:r1] = rotate_pairs(tile_rows(p, ins), r0, p["head_dim"], int(ins[3][0]), ins[4])


SPEC = OpSpec(
    name="RMS_LINEAR_ROPE", code=2, doc=__doc__,
    shared=lambda p, ins, outs: gemv_shared(ins[2].shape[1], p["nrows"], ins[8], w=ins[2]),
    inputs=(Slot("x", ACT, F32, tagged=True), Slot("gamma", W), Slot("w", W, PACKED), Slot("pos", INP, I32, role=POSITION),
            Slot("freqs", W, F32)) + EPILOGUE + CONSUME,
    outputs=(Slot("y", ACT, F32, tagged=True),),
    params=NORMED + (HEAD_DIM, LORA_OFF),
    check=check,
    accesses=lambda p, i, o: (normed_accesses(p, i, o) + [Access("in", 3, full(i[3].shape)),
                                                          Access("in", 4, full(i[4].shape))]
                              + epilogue_accesses(p, i, 5) + consume_accesses(i, 7)),
    reference=reference, streams=row_streams,
    cost=lambda p, ins, outs: (tile_cost(p, ins[2])[0] + consume_cost(ins[8], ins[7], p["nrows"]),
                               tile_cost(p, ins[2])[1]),
    prewait=RMS_PREWAIT,
)
