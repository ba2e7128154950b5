"""ROUTE: a mixture-of-experts router's choice, from the router logits of its GEMV tiles: per-expert
scores (softmax, sigmoid or sqrt-softplus), an optional ranking bias, grouped top-k, the stable top-k
(ties to the lower id, NaN last), then the weights of the chosen experts from the UNbiased scores,
renormalised (sum + eps; a zero sum gives zero weights) and scaled, in slot order. With a hash table
the ids are table[token] instead, and the weights the scores there; a hash-routed layer splits in two
ROUTE tasks: one without logits writes the ids alone at the step's start (so the loader streams the
chosen experts as early as a dense layer's), one without the ids output writes the weights once the
logits are in. instructions/routing.py is the specification; the expert opcodes read the ids it writes."""
from megavm.core.limits import MAX_EXPERTS, MAX_TOPK, ROUTE_WARP_EXPERTS
from megavm.instructions.routing import SCORE_FNS, hash_route, route
from megavm.instructions.spec import ACT, F32, I32, INP, TOKEN, Access, OpSpec, Param, Slot, W, full, need

SCORE = Param("score", "score function: " + ", ".join(f"{i} {n}" for i, n in enumerate(SCORE_FNS)))


def _k(ins, outs) -> int | None:
    for b in (outs[0], outs[1], ins[2]):
        if b is not None and len(b.shape) in (1, 2):
            return b.shape[-1]
    return None


def check(p, ins, outs):
    probs = []
    logits, bias, table = ins[0], ins[1], ins[2]
    ids, weights = outs
    need(logits is not None or (table is not None and ids is not None and weights is None), probs,
         "without logits ROUTE writes a hash layer's ids alone: it takes a table and the ids output, not weights")
    need(ids is not None or (table is not None and weights is not None), probs,
         "without the ids output ROUTE writes a hash layer's weights: it takes a table and the weights output")
    need(logits is None or len(logits.shape) == 1, probs, f"logits must be a vector, has shape "
                                                          f"{None if logits is None else logits.shape}")
    for name, b in (("ids", ids), ("weights", weights)):
        need(b is None or len(b.shape) == 1, probs, f"{name} must be a vector of the k chosen, has shape "
                                                    f"{None if b is None else b.shape}")
    if probs:
        return probs
    k = _k(ins, outs)
    need(ids is None or weights is None or ids.shape == weights.shape, probs,
         f"ids {ids.shape if ids else None} and weights {weights.shape if weights else None} must be vectors of the "
         f"same length k")
    e = logits.shape[0] if logits is not None else MAX_EXPERTS
    if logits is not None:
        need(1 <= e <= MAX_EXPERTS, probs, f"{e} experts: a router chooses among 1 to {MAX_EXPERTS}")
    need(k is not None and 1 <= k <= min(e, MAX_TOPK), probs,
         f"k={k} experts chosen of {e}: k must be in [1, {min(e, MAX_TOPK)}]")
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
        need(len(table.shape) == 2 and table.shape[1] == k, probs,
             f"hash table has shape {table.shape}, expected (vocab, {k})")
        need(bias is None and g == 1, probs, "a hash-routed layer takes no ranking bias and no groups")
    return probs


def accesses(p, ins, outs):
    out = [Access("out", j, full(b.shape)) for j, b in enumerate(outs) if b is not None]
    return ([Access("in", 0, full(ins[0].shape))] if ins[0] is not None else []) + out


def reference(p, ins, outs):
    logits, bias, table, token = ins
    fn, renorm = SCORE_FNS[p["score"]], bool(p["renorm"])
    if logits is None:                              # a hash layer's ids, at the step's start
        outs[0][:] = table[int(token[0])].to(outs[0].dtype)
        return
    if table is not None:
        ids, w = hash_route(logits, token[0], table, fn, renorm, p["eps"], p["scale"])
    else:
        ids, w = route(logits, outs[0].shape[0], fn, bias, p["n_group"], p["topk_group"], renorm, p["eps"], p["scale"])
    if outs[0] is not None:
        outs[0][:] = ids.to(outs[0].dtype)
    outs[1][:] = w


def weight_values(p, ins, tensors):
    """A hash table's ids must name experts: one outside [0, experts) would index past the stacks."""
    if tensors[2] is None or ins[0] is None:      # (the ids-only task's table is checked by its weights task)
        return []
    table, e = tensors[2], ins[0].shape[0]
    bad = ((table < 0) | (table >= e)).nonzero()
    if len(bad):
        t, j = (int(x) for x in bad[0])
        return [f"hash table {ins[2].name!r} holds expert id {int(table[t, j])} at token {t}, slot {j}: "
                f"outside the {e} experts"]
    return []


def _shared(p, ins) -> int:
    """Floats of xs (route.cuh): none on the one-warp path (at most ROUTE_WARP_EXPERTS, no hash table, no
    groups) or for a hash layer's ids alone; else the scores, ranking keys and chosen ids, MAX_EXPERTS
    slots each, then a key a group."""
    logits, table = ins[0], ins[2]
    if logits is None or (logits.shape[0] <= ROUTE_WARP_EXPERTS and table is None and p.get("n_group", 1) <= 1):
        return 0
    return 3 * MAX_EXPERTS + logits.shape[0]


SPEC = OpSpec(
    name="ROUTE", code=17, doc=__doc__,
    inputs=(Slot("logits", ACT, F32, optional=True, tagged=True), Slot("bias", W, optional=True),
            Slot("table", W, I32, optional=True),
            Slot("token", INP, I32, role=TOKEN, bound=("table", 0), optional=True)),
    outputs=(Slot("ids", ACT, I32, optional=True), Slot("weights", ACT, F32, optional=True)),
    params=(SCORE, Param("n_group", "expert groups of grouped top-k (1: none)", default=1),
            Param("topk_group", "groups kept by grouped top-k", default=1),
            Param("renorm", "1: the chosen weights are divided by their sum + eps"),
            Param("eps", "renormalisation epsilon", f32=True, default=0.0),
            Param("scale", "routed scaling factor, after renormalisation", f32=True, default=1.0)),
    check=check, accesses=accesses, reference=reference, weight_values=weight_values,
    cost=lambda p, ins, outs: ((ins[0].shape[0] * 4 if ins[0] is not None else 0) + 8 * _k(ins, outs), 0),
    shared=lambda p, ins, outs: _shared(p, ins),
)
