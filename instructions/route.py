"""ROUTE: a mixture-of-experts router's choice, from the router logits of its GEMV tiles: per-expert
scores (softmax, sigmoid or sqrt-softplus), an optional ranking bias, grouped top-k, the stable top-k
(ties to the lower id, NaN last), then the weights of the chosen experts from the UNbiased scores,
renormalised (sum + eps; a zero sum gives zero weights) and scaled, in slot order. With a hash table
the ids are table[token] instead, and the weights the scores there. instructions/routing.py is the
specification; the expert opcodes read the ids it writes."""
from megavm.core.limits import MAX_EXPERTS, MAX_TOPK
from megavm.instructions.routing import SCORE_FNS, hash_route, route
from megavm.instructions.spec import ACT, F32, I32, INP, TOKEN, Access, OpSpec, Param, Slot, W, full, need

SCORE = Param("score", "score function: " + ", ".join(f"{i} {n}" for i, n in enumerate(SCORE_FNS)))


def check(p, ins, outs):
    probs = []
    logits, bias, table = ins[0], ins[1], ins[2]
    ids, weights = outs
    need(len(logits.shape) == 1, probs, f"logits must be a vector, has shape {logits.shape}")
    need(len(ids.shape) == 1 and weights.shape == ids.shape, probs,
         f"ids {ids.shape} and weights {weights.shape} must be vectors of the same length k")
    if probs:
        return probs
    e, k = logits.shape[0], ids.shape[0]
    need(1 <= e <= MAX_EXPERTS, probs, f"{e} experts: a router chooses among 1 to {MAX_EXPERTS}")
    need(1 <= k <= min(e, MAX_TOPK), probs, f"k={k} experts chosen of {e}: k must be in [1, {min(e, MAX_TOPK)}]")
    need(0 <= p["score"] < len(SCORE_FNS), probs, f"score={p['score']} is not one of 0..{len(SCORE_FNS) - 1}")
    need(p["renorm"] in (0, 1), probs, f"renorm={p['renorm']} must be 0 or 1")
    need(p["eps"] >= 0 and p["scale"] > 0, probs, f"eps={p['eps']} must be >= 0 and scale={p['scale']} > 0")
    if bias is not None:
        need(bias.shape == (e,), probs, f"bias has shape {bias.shape}, expected ({e},)")
    g, tg = p["n_group"], p["topk_group"]
    need(g >= 1 and e % g == 0 and 1 <= tg <= g and (g == 1 or e // g >= 2), probs,
         f"n_group={g}, topk_group={tg}: {e} experts must split into n_group groups of at least 2, "
         f"keeping 1..n_group of them")
    need((table is None) == (ins[3] is None), probs, "a hash table and the token come together")
    if table is not None:
        need(table.shape == (table.shape[0], k), probs, f"hash table has shape {table.shape}, expected (vocab, {k})")
        need(bias is None and g == 1, probs, "a hash-routed layer takes no ranking bias and no groups")
    return probs


def accesses(p, ins, outs):
    return [Access("in", 0, full(ins[0].shape)), Access("out", 0, full(outs[0].shape)),
            Access("out", 1, full(outs[1].shape))]


def reference(p, ins, outs):
    logits, bias, table, token = ins
    fn, renorm = SCORE_FNS[p["score"]], bool(p["renorm"])
    if table is not None:
        ids, w = hash_route(logits, token[0], table, fn, renorm, p["eps"], p["scale"])
    else:
        ids, w = route(logits, outs[0].shape[0], fn, bias, p["n_group"], p["topk_group"], renorm, p["eps"], p["scale"])
    outs[0][:] = ids.to(outs[0].dtype)
    outs[1][:] = w


def weight_values(p, ins, tensors):
    """A hash table's ids must name experts: one outside [0, experts) would index past the stacks."""
    table, e = tensors[2], ins[0].shape[0]
    if table is None:
        return []
    bad = ((table < 0) | (table >= e)).nonzero()
    if len(bad):
        t, j = (int(x) for x in bad[0])
        return [f"hash table {ins[2].name!r} holds expert id {int(table[t, j])} at token {t}, slot {j}: "
                f"outside the {e} experts"]
    return []


SPEC = OpSpec(
    name="ROUTE", code=17, doc=__doc__,
    inputs=(Slot("logits", ACT, F32), Slot("bias", W, optional=True), Slot("table", W, I32, optional=True),
            Slot("token", INP, I32, role=TOKEN, bound=("table", 0), optional=True)),
    outputs=(Slot("ids", ACT, I32), Slot("weights", ACT, F32)),
    params=(SCORE, Param("n_group", "expert groups of grouped top-k (1: none)", default=1),
            Param("topk_group", "groups kept by grouped top-k", default=1),
            Param("renorm", "1: the chosen weights are divided by their sum + eps"),
            Param("eps", "renormalisation epsilon", f32=True, default=0.0),
            Param("scale", "routed scaling factor, after renormalisation", f32=True, default=1.0)),
    check=check, accesses=accesses, reference=reference, weight_values=weight_values,
    cost=lambda p, ins, outs: (ins[0].shape[0] * 4 + outs[0].shape[0] * 8, 0),
)
