"""EMBED: x[col0:col0+ncols] = scale * table[token, col0:col0+ncols], the token a runtime input (scale:
1, or sqrt(dim) for Gemma). With LoRA on layer 0's q/k/v, it also writes its partial product of their
A with its columns of x (instructions/lora.py)."""
from megavm.instructions.lora import (
    LORA_T,
    NEXT_A,
    NEXT_G,
    NEXT_U,
    PRODUCE_ID,
    adapter_id,
    check_produce,
    produce,
    produce_accesses,
    produce_cost,
)
from megavm.instructions.spec import ACT, F32, I32, INP, TOKEN, Access, OpSpec, Param, Slot, W, full, need, rows


def check(p, ins, outs):
    probs = []
    table, tok, x = ins[0].shape, ins[1].shape, outs[0].shape
    if len(table) == 2:
        check_produce(p, ins[2], outs[1], ins[3], table[1], probs, ins[4])
    need(len(table) == 2, probs, f"table must be 2-D, has shape {table}")
    if probs:
        return probs
    d = table[1]
    need(tok == (1,), probs, f"token has shape {tok}, expected (1,)")
    need(x == (d,), probs, f"x has shape {x}, expected ({d},)")
    need(p["ncols"] >= 1 and 0 <= p["col0"] and p["col0"] + p["ncols"] <= d, probs,
         f"cols [{p['col0']}, {p['col0'] + p['ncols']}) outside embedding width {d}")
    return probs


def accesses(p, ins, outs):
    return [Access("in", 0, full(ins[0].shape)), Access("in", 1, full(ins[1].shape)),
            Access("out", 0, rows(p["col0"], p["col0"] + p["ncols"])), *produce_accesses(p, ins, outs, 2, 3, 1, 4)]


def reference(p, ins, outs):
    table, token = ins[:2]
    t = int(token[0])
    if not 0 <= t < table.shape[0]:
        raise ValueError(f"EMBED: token id {t} outside vocabulary of {table.shape[0]}")
    c0, c1 = p["col0"], p["col0"] + p["ncols"]
    outs[0][c0:c1] = table[t, c0:c1].float() * p["scale"]
    produce(p, ins[2], outs[1], adapter_id(ins, 3), outs[0][c0:c1], c0, ins[4])


SPEC = OpSpec(
    name="EMBED", code=0, doc=__doc__,
    shared=lambda p, ins, outs: 0,                 # LoRA's producer side reads x back (lora.cuh: lora_v)
    inputs=(Slot("table", W), Slot("token", INP, I32, role=TOKEN, bound=("table", 0)), NEXT_A, PRODUCE_ID,
            NEXT_G),
    outputs=(Slot("x", ACT, F32, tagged=True), NEXT_U),
    params=(Param("col0", "first embedding column the tile copies"), Param("ncols", "columns the tile copies"),
            Param("scale", "the factor the embedding is scaled by", f32=True), LORA_T),
    check=check, accesses=accesses, reference=reference,
    cost=lambda p, ins, outs: (p["ncols"] * (ins[0].dtype.itemsize + 4) + produce_cost(p, ins[2], p["ncols"]), 0),
)
