"""LINEAR_RESIDUAL: y[rows] = res[rows] + W[rows] @ a: the o-projection and down-projection tiles with
the residual add in their epilogue.

a is an activation vector, or a 4-D buffer of attention partials [kv_heads, blocks, group,
head_dim + 2] (instructions/attention.py), which the tile combines on load: the o-projection with
ATTN_COMBINE fused in.

With LoRA (instructions/lora.py) the tile adds its rows of B (A a) before the residual (the consumer
side), and writes its partial product of the next projections' A with its rows of y (the producer
side: the o tiles feed gate/up, the down tiles the next layer's q/k/v)."""
import torch

from megavm.core.limits import MAX_K
from megavm.instructions.attention import combine, combine_scratch
from megavm.instructions.lora import (
    CONSUME,
    LORA_OFF,
    LORA_T,
    NEXT_A,
    NEXT_G,
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
from megavm.instructions.spec import ACT, F32, PACKED, Access, OpSpec, Slot, W, full, need, rows
from megavm.instructions.tiles import (
    NROWS,
    ROW0,
    check_matrix,
    check_row_tile,
    check_vec,
    gemv_shared,
    matvec,
    row_streams,
    tc_shared,
    tile,
    tile_accesses,
    tile_cost,
)


def check(p, ins, outs):
    probs = []
    a, w, res = ins[:3]
    if not check_matrix(w, probs):
        return probs
    n, k = w.shape
    if len(a.shape) == 4:
        nkv, nblk, g, width = a.shape
        need(nkv * g * (width - 2) == k, probs, f"partials {a.shape} combine to {nkv * g * (width - 2)} values, "
                                                f"w has {k} columns")
        scratch = k + combine_scratch(nkv, nblk, g)
        need(scratch <= MAX_K, probs, f"combining partials {a.shape} needs {scratch} floats of scratch, "
                                      f"more than {MAX_K}")
    else:
        check_vec(a, k, probs, "a")
    check_vec(res, n, probs, "res")
    check_vec(outs[0], n, probs, "y")
    check_row_tile(p, w, probs)
    check_consume(p, ins[3], ins[4], ins[5], n, probs)
    check_produce(p, ins[6], outs[1], ins[5], n, probs, ins[7])
    return probs


def shared(p, ins, outs):
    """gemv_shared, and with partials to combine (4-D a) their scratch beside x (linear_residual.cuh: done
    with before the GEMV, whose tensor-core path may then use that xs: tc_shared, x itself too: the task is
    done with it after the GEMV)."""
    a, w = ins[:2]
    n = gemv_shared(w.shape[1], p["nrows"], ins[4])
    n = n if len(a.shape) != 4 else n + combine_scratch(*a.shape[:3])
    return max(n, tc_shared(w, w.shape[1], p["nrows"], consumes_x=True))


def accesses(p, ins, outs):
    r = rows(*tile(p))
    return [Access("in", 0, full(ins[0].shape)), *tile_accesses(p, 1, ins[1]), Access("in", 2, r), Access("out", 0, r),
            *consume_accesses(ins, 3), *produce_accesses(p, ins, outs, 6, 5, 1, 7)]


def reference(p, ins, outs):
    a, w, res, lu, lb = ins[:5]
    aid = adapter_id(ins, 5)
    if a.dim() == 4:
        a = torch.cat([combine(a[h]) for h in range(a.shape[0])])
    r0, r1 = tile(p)
    acc = matvec(w[r0:r1], a.float()) + low_rank(p, lu, lb, aid, r0, r1 - r0, col=p["lora_off"])
    outs[0][r0:r1] = res[r0:r1] + acc
    produce(p, ins[6], outs[1], aid, outs[0][r0:r1], r0, ins[7])


SPEC = OpSpec(
    name="LINEAR_RESIDUAL", code=5, doc=__doc__,
    shared=shared,
    inputs=(Slot("a", ACT, F32, tagged=True), Slot("w", W, PACKED), Slot("res", ACT, F32, tagged=True)) + CONSUME + (NEXT_A, NEXT_G),
    outputs=(Slot("y", ACT, F32, tagged=True), NEXT_U),
    params=(ROW0, NROWS, LORA_OFF, LORA_T),
    check=check, accesses=accesses, reference=reference,
    streams=lambda p, ins, outs: row_streams(p, ins, outs, slots=(1,)),
    cost=lambda p, ins, outs: (tile_cost(p, ins[1])[0] + consume_cost(ins[4], ins[3], p["nrows"])
                               + produce_cost(p, ins[6], p["nrows"]), tile_cost(p, ins[1])[1]),
)
