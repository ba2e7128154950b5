"""ATTN_COMBINE: merge the blocks' partials of one KV head, in block order, into the attention
output of its query heads (instructions/attention.py). With LoRA on the o-projection, it also writes
its partial product of that A with its rows of the output (instructions/lora.py)."""
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
from megavm.instructions.spec import ACT, F32, Access, OpSpec, Slot, need


def check(p, ins, outs):
    probs = []
    part, attn = ins[0].shape, outs[0].shape
    need(len(part) == 4, probs, f"partials must be 4-D, have shape {part}")
    if probs:
        return probs
    nkv, nblk, g, w = part
    need(attn == (nkv * g * (w - 2),), probs, f"attn has shape {attn}, expected ({nkv * g * (w - 2)},)")
    need(0 <= p["kv_head"] < nkv, probs, f"kv_head={p['kv_head']} outside {nkv} KV heads")
    need(combine_scratch(1, nblk, g) <= MAX_K, probs,
         f"group {g} x {nblk} blocks exceeds the combine's scratch of {MAX_K} floats")
    check_produce(p, ins[1], outs[1], ins[2], nkv * g * (w - 2), probs)
    return probs


def accesses(p, ins, outs):
    _, nblk, g, w = ins[0].shape
    h, hd = p["kv_head"], w - 2
    return [Access("in", 0, ((h, h + 1), (0, nblk), (0, g), (0, w))),
            Access("out", 0, ((h * g * hd, (h + 1) * g * hd),)), *produce_accesses(p, ins, outs, 1, 2, 1)]


def reference(p, ins, outs):
    h = p["kv_head"]
    out = combine(ins[0][h])
    outs[0][h * out.numel():(h + 1) * out.numel()] = out
    produce(p, ins[1], outs[1], adapter_id(ins, 2), out, h * out.numel())


SPEC = OpSpec(
    name="ATTN_COMBINE", code=7, doc=__doc__,
    inputs=(Slot("part", ACT, F32, tagged=True), NEXT_A, PRODUCE_ID),
    outputs=(Slot("attn", ACT, F32, tagged=True), NEXT_U),
    params=(KV_HEAD, LORA_T),
    check=check, accesses=accesses, reference=reference,
    cost=lambda p, ins, outs: (ins[0].shape[1] * ins[0].shape[2] * ins[0].shape[3] * 4
                               + produce_cost(p, ins[1], ins[0].shape[2] * (ins[0].shape[3] - 2)), 0),
)
