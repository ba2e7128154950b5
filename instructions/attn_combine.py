"""ATTN_COMBINE: merge the blocks' partials of one KV head, in block order, into the attention
output of its query heads (instructions/attention.py), all of the group's or a range of them (q0,
q_heads: several tasks share a group's work). With LoRA on the o-projection, it also writes its
partial product of that A with its rows of the output (instructions/lora.py)."""
from megavm.core.limits import MAX_K
from megavm.instructions.attention import KV_HEAD, combine, combine_scratch
from megavm.instructions.lora import (
    LORA_T,
    NEXT_A,
    NEXT_U,
    PRODUCE_ID,
    adapter_id,
    check_produce,
    produce,
    produce_accesses,
    produce_cost,
)
from megavm.instructions.spec import ACT, F32, Access, OpSpec, Param, Slot, need

Q0 = Param("q0", "first query head of the KV head's group that the task merges", default=0)
Q_HEADS = Param("q_heads", "query heads the task merges from q0; 0: the rest of the group", default=0)


def q_range(p: dict, g: int) -> tuple[int, int]:
    """(first, count) of the group's query heads a task merges."""
    return p["q0"], p["q_heads"] or g - p["q0"]


def check(p, ins, outs):
    probs = []
    part, attn = ins[0].shape, outs[0].shape
    need(len(part) == 4, probs, f"partials must be 4-D, have shape {part}")
    if probs:
        return probs
    nkv, nblk, g, w = part
    need(attn == (nkv * g * (w - 2),), probs, f"attn has shape {attn}, expected ({nkv * g * (w - 2)},)")
    need(0 <= p["kv_head"] < nkv, probs, f"kv_head={p['kv_head']} outside {nkv} KV heads")
    q0, n = q_range(p, g)
    need(0 <= q0 < g and 1 <= n <= g - q0, probs,
         f"query heads q0={p['q0']}, q_heads={p['q_heads']} outside the group of {g}")
    need(combine_scratch(1, nblk, g) <= MAX_K, probs,
         f"group {g} x {nblk} blocks exceeds the combine's scratch of {MAX_K} floats")
    check_produce(p, ins[1], outs[1], ins[2], nkv * g * (w - 2), probs)
    return probs


def accesses(p, ins, outs):
    _, nblk, g, w = ins[0].shape
    h, hd = p["kv_head"], w - 2
    q0, n = q_range(p, g)
    o0 = (h * g + q0) * hd
    return [Access("in", 0, ((h, h + 1), (0, nblk), (q0, q0 + n), (0, w))),
            Access("out", 0, ((o0, o0 + n * hd),)), *produce_accesses(p, ins, outs, 1, 2, 1)]


def reference(p, ins, outs):
    h, (_, _, g, w) = p["kv_head"], ins[0].shape
    q0, n = q_range(p, g)
    out = combine(ins[0][h, :, q0:q0 + n])
    o0 = (h * g + q0) * (w - 2)
    outs[0][o0:o0 + out.numel()] = out
    produce(p, ins[1], outs[1], adapter_id(ins, 2), out, o0)


def cost(p, ins, outs):
    _, nblk, g, w = ins[0].shape
    n = q_range(p, g)[1]
    return nblk * n * w * 4 + produce_cost(p, ins[1], n * (w - 2)), 0


def shared(p, ins, outs):
    """combine_scratch of one head (what check holds to MAX_K); LoRA's producer side, where present, reads
    the written attention output back (lora.cuh: lora_v) and keeps nothing in xs."""
    _, nblk, g, _ = ins[0].shape
    return combine_scratch(1, nblk, g)


SPEC = OpSpec(
    name="ATTN_COMBINE", code=7, doc=__doc__,
    shared=shared,
    inputs=(Slot("part", ACT, F32, tagged=True), NEXT_A, PRODUCE_ID),
    outputs=(Slot("attn", ACT, F32, tagged=True), NEXT_U),
    params=(KV_HEAD, LORA_T, Q0, Q_HEADS),
    check=check, accesses=accesses, reference=reference, cost=cost,
)
