"""RMS_LINEAR_KV: a key or value projection tile, rmsnorm then W[rows] @ x (plus its LoRA term where
present, instructions/lora.py), whose epilogue (the bias and per-head norm where present,
instructions/qkv.py; then RoPE, for keys) appends the rows to the KV cache at position pos
(instructions/kv_cache.py). With `row`, it also writes them in f32 to that vector (tagged: the
attention partials of this step read their own row there, docs/ir.md)."""
from megavm.instructions.kv_cache import ROPE, append, cache_box, check_cache
from megavm.instructions.lora import CONSUME, LORA_OFF, consume_accesses, consume_cost
from megavm.instructions.qkv import EPILOGUE, check_tile_inputs, epilogue_accesses, tile_rows
from megavm.instructions.rotary import HEAD_DIM
from megavm.instructions.spec import ACT, F32, PACKED, I32, INP, KV, POSITION, Access, OpSpec, Slot, W, full
from megavm.instructions.tiles import (NORMED, RMS_PREWAIT, check_normed, gemv_shared, row_streams, tile_accesses,
                                      tile_cost)


def check(p, ins, outs):
    probs = check_normed(p, ins, outs, out_rows=False)
    n = ins[2].shape[0] if len(ins[2].shape) == 2 else None
    check_cache(p, outs[0], n, probs)
    row = outs[1] if len(outs) > 1 else None
    if row is not None and n is not None and row.shape != (n,):
        probs.append(f"row has shape {row.shape}, expected ({n},): the projection's rows")
    check_tile_inputs(p, ins, probs, rope=bool(p["rope"]))
    return probs


def accesses(p, ins, outs):
    return [Access("in", 0, full(ins[0].shape)), Access("in", 1, full(ins[1].shape)), *tile_accesses(p, 2, ins[2]),
            Access("in", 3, full(ins[3].shape)), Access("in", 4, full(ins[4].shape)), *epilogue_accesses(p, ins, 5), *consume_accesses(ins, 7),
            Access("out", 0, cache_box(p, outs[0]))] + (
        [Access("out", 1, ((p["row0"], p["row0"] + p["nrows"]),))] if len(outs) > 1 and outs[1] is not None else [])


def reference(p, ins, outs):
    y = append(p, tile_rows(p, ins), int(ins[3][0]), ins[4], outs[0], "RMS_LINEAR_KV")
    if len(outs) > 1 and outs[1] is not None:      # the rows as appended, in f32, for this step's partials
        outs[1][p["row0"]:p["row0"] + p["nrows"]] = y


SPEC = OpSpec(
    name="RMS_LINEAR_KV", code=3, doc=__doc__,
    shared=lambda p, ins, outs: gemv_shared(ins[2].shape[1], p["nrows"], ins[8], w=ins[2]),
    inputs=(Slot("x", ACT, F32, tagged=True), Slot("gamma", W), Slot("w", W, PACKED),
            Slot("pos", INP, I32, role=POSITION, bound=("cache", 1)), Slot("freqs", W, F32)) + EPILOGUE + CONSUME,
    outputs=(Slot("cache", KV), Slot("row", ACT, F32, optional=True, tagged=True)),
    params=NORMED + (HEAD_DIM, ROPE, LORA_OFF),
    check=check, accesses=accesses, reference=reference, streams=row_streams,
    cost=lambda p, ins, outs: (tile_cost(p, ins[2])[0] + consume_cost(ins[8], ins[7], p["nrows"]),
                               tile_cost(p, ins[2])[1]),
    prewait=RMS_PREWAIT,
)
