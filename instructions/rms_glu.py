"""RMS_GLU: h[rows] = act(Wg[rows] @ n) * (Wu[rows] @ n), n = rmsnorm(x, gamma): the gate and up
projections of a gated MLP in one tile (act silu: SwiGLU; gelu_tanh: Gemma's GeGLU). With limit > 0
(DeepSeek-V4's swiglu_limit) the gate is clamped above at limit and the up projection to
[-limit, limit] before they meet.

With LoRA (instructions/lora.py) each of the gate and up rows gets its low-rank term (lora_b holds the
gate's rows, then the up's; lora_u their columns side by side), and the tile writes its partial
product of the down projection's A with its rows of h."""
from megavm.core.limits import MAX_TILE_ROWS
from megavm.instructions.activations import ACT_CODE, LIMIT, activate, check_act
from megavm.instructions.lora import (
    CONSUME,
    LORA_OFF,
    LORA_T,
    NEXT_A,
    NEXT_U,
    adapter_id,
    check_consume,
    check_produce,
    consume_accesses,
    consume_cost,
    low_rank,
    produce,
    produce_accesses,
    produce_cost,
)
from megavm.instructions.spec import ACT, F32, PACKED, Access, Hook, OpSpec, Slot, W, full, need, rows
from megavm.instructions.tiles import (
    NORMED,
    check_normed,
    gemv_shared,
    matvec,
    norm_input,
    row_streams,
    rstd,
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
    need(p["limit"] >= 0, probs, f"limit={p['limit']} must be >= 0 (0: no clamp)")
    if len(wg.shape) == 2:
        check_consume(p, ins[4], ins[5], ins[6], wg.shape[0], probs, normed=p["norm"] == 1, halves=2)
        check_produce(p, ins[7], outs[1], ins[6], wg.shape[0], probs)
    return probs


def accesses(p, ins, outs):
    return [Access("in", 0, full(ins[0].shape)), Access("in", 1, full(ins[1].shape)),
            *tile_accesses(p, 2, ins[2]), *tile_accesses(p, 3, ins[3]), Access("out", 0, rows(*tile(p))),
            *consume_accesses(ins, 4), *produce_accesses(p, ins, outs, 7, 6, 1)]


def reference(p, ins, outs):
    x, g, wg, wu, lu, lb = ins[:6]
    aid, (r0, r1), F = adapter_id(ins, 6), tile(p), wg.shape[0]
    n = norm_input(p, x, g)
    s = rstd(x, p["eps"])
    gate = matvec(wg[r0:r1], n) + low_rank(p, lu, lb, aid, r0, r1 - r0, s, p["lora_off"])
    rank = lb.shape[2] if lb is not None else 0
    up = matvec(wu[r0:r1], n) + low_rank(p, lu, lb, aid, F + r0, r1 - r0, s, p["lora_off"] + rank)
    if p["limit"] > 0:
        gate, up = gate.clamp(max=p["limit"]), up.clamp(-p["limit"], p["limit"])
    outs[0][r0:r1] = activate(p["act"], gate) * up
    produce(p, ins[7], outs[1], aid, outs[0][r0:r1], r0)


SPEC = OpSpec(
    name="RMS_GLU", code=4, doc=__doc__,
    shared=lambda p, ins, outs: gemv_shared(ins[2].shape[1], p["nrows"], ins[5], 2, ins[2]),
    inputs=(Slot("x", ACT, F32, tagged=True), Slot("gamma", W), Slot("wg", W, PACKED), Slot("wu", W, PACKED)) + CONSUME + (NEXT_A,),
    outputs=(Slot("h", ACT, F32, tagged=True), NEXT_U),
    params=NORMED + (ACT_CODE, LORA_OFF, LORA_T, LIMIT),
    check=check, accesses=accesses, reference=reference,
    streams=lambda p, ins, outs: row_streams(p, ins, outs, slots=(2, 3)),
    cost=lambda p, ins, outs: (tile_cost(p, ins[2], nmats=2)[0] + consume_cost(ins[5], ins[4], 2 * p["nrows"])
                               + produce_cost(p, ins[7], p["nrows"]), tile_cost(p, ins[2], nmats=2)[1]),
    prewait=Hook("rms_prewait", ("norm", "gamma", "wg")),
)
