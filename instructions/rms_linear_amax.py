"""RMS_LINEAR_AMAX: a key or value tile for a quantized KV cache, rmsnorm then W[rows] @ x (plus its
LoRA term where present), its epilogue as RMS_LINEAR_KV's (bias and per-head norm where present, then
RoPE for keys), writing the finished rows to y and their largest magnitude to amax[tile]: the first of
the two dependent steps of a quantized append, KV_QUANT the second (instructions/kv_quant.py). Its
device code is RMS_LINEAR_KV's (instructions/rms_linear_kv.cuh), which branches on the opcode."""
from megavm.instructions.kv_cache import ROPE
from megavm.instructions.lora import CONSUME, LORA_OFF, consume_accesses, consume_cost
from megavm.instructions.qkv import EPILOGUE, check_tile_inputs, epilogue_accesses, tile_rows
from megavm.instructions.rotary import HEAD_DIM, rotate_pairs
from megavm.instructions.spec import ACT, F32, I32, INP, PACKED, POSITION, Access, OpSpec, Param, Slot, W, full, need
from megavm.instructions.tiles import (NORMED, RMS_PREWAIT, check_normed, gemv_shared, normed_accesses, row_streams,
                                      tile, tile_cost)

TILE = Param("tile", "the tile's slot in amax, where it writes the largest magnitude of its rows")


def check(p, ins, outs):
    probs = check_normed(p, ins, outs)
    need(p["rope"] in (0, 1), probs, f"rope={p['rope']} must be 0 or 1")
    check_tile_inputs(p, ins, probs, rope=p["rope"] == 1)
    amax = outs[1].shape
    need(len(amax) == 1 and 0 <= p["tile"] < amax[0], probs,
         f"tile={p['tile']} outside amax of shape {amax} (one slot per tile)")
    return probs


def reference(p, ins, outs):
    r0, r1 = tile(p)
    y = tile_rows(p, ins)
    if p["rope"]:
        y = rotate_pairs(y, r0, p["head_dim"], int(ins[3][0]), ins[4])
    outs[0][r0:r1] = y
    outs[1][p["tile"]] = y.abs().max()


SPEC = OpSpec(
    name="RMS_LINEAR_AMAX", code=21, doc=__doc__,
    inputs=(Slot("x", ACT, F32, tagged=True), Slot("gamma", W), Slot("w", W, PACKED), Slot("pos", INP, I32, role=POSITION),
            Slot("freqs", W, F32)) + EPILOGUE + CONSUME,
    outputs=(Slot("y", ACT, F32), Slot("amax", ACT, F32)),
    params=NORMED + (HEAD_DIM, ROPE, LORA_OFF, TILE),
    check=check,
    accesses=lambda p, i, o: (normed_accesses(p, i, o) + [Access("in", 3, full(i[3].shape)),
                                                          Access("in", 4, full(i[4].shape)),
                                                          Access("out", 1, ((p["tile"], p["tile"] + 1),))]
                              + epilogue_accesses(p, i, 5) + consume_accesses(i, 7)),
    reference=reference, streams=row_streams,
    cost=lambda p, ins, outs: (tile_cost(p, ins[2])[0] + consume_cost(ins[8], ins[7], p["nrows"]),
                               tile_cost(p, ins[2])[1]),
    prewait=RMS_PREWAIT, body="RMS_LINEAR_KV",
    shared=lambda p, ins, outs: gemv_shared(ins[2].shape[1], p["nrows"], ins[8], w=ins[2]),   # RMS_LINEAR_KV's body
)
