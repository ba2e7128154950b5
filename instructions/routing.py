"""Mixture-of-experts routing, as the router opcodes compute it: score functions, the stable top-k,
grouped top-k, renormalisation, the routed scaling factor and hash routing. This is the
specification the router opcodes' references and kernels are held to, in f32; expert ids are exact.

Definitions (each where the model families leave room):
- top-k ranks by value, ties to the LOWER index, deterministically; NaN ranks below every number and
  -inf, so a NaN score is chosen only when fewer than k others exist. With all scores equal (all-zero
  logits, or scores that underflow to 0) the ids are 0 .. k-1.
- The bias (DeepSeek's e_score_correction_bias) ranks; the weights come from the UNbiased scores.
- Renormalisation divides by (sum + eps); a sum of 0 (every chosen score underflowed) gives weights
  of 0, never NaN. The routed scaling factor multiplies after renormalisation.
- Grouped top-k (DeepSeek-V3): a group's score is the sum of its two best biased scores; the topk_group
  best groups (ties to the lower group) stay, the other groups' experts are out of the running.
- Hash routing (DeepSeek-V4's first layers): the ids are table[token], the weights the scores at them.
"""
from __future__ import annotations

import torch

SCORE_FNS = ("softmax", "sigmoid", "sqrt_softplus")


def softplus(x: torch.Tensor) -> torch.Tensor:
    """log(1 + e^x), stably: max(x, 0) + log1p(exp(-|x|))."""
    return x.clamp_min(0) + torch.log1p(torch.exp(-x.abs()))


def scores(logits: torch.Tensor, fn: str) -> torch.Tensor:
    """Per-expert scores of router logits [..., experts], in f32."""
    x = logits.float()
    if fn == "softmax":
        return torch.softmax(x, dim=-1)
    if fn == "sigmoid":
        return torch.sigmoid(x)
    if fn == "sqrt_softplus":
        return softplus(x).sqrt()
    raise ValueError(f"score function {fn!r} is not one of {SCORE_FNS}")


def stable_topk(values: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(values, ids) of the k largest along the last axis, largest first, ties to the lower index."""
    if not 1 <= k <= values.shape[-1]:
        raise ValueError(f"k={k} must be in [1, {values.shape[-1]}]")
    key = torch.where(torch.isnan(values), torch.full_like(values, float("-inf")), values)
    order = torch.argsort(key, dim=-1, descending=True, stable=True)     # by value, ties in index order
    nan = torch.isnan(values).gather(-1, order).to(torch.int8)
    ids = order.gather(-1, torch.argsort(nan, dim=-1, stable=True))[..., :k]   # then NaN last, order kept
    return values.gather(-1, ids), ids


def group_mask(biased: torch.Tensor, n_group: int, topk_group: int) -> torch.Tensor:
    """biased [..., experts] with the experts of all but the topk_group best groups set to -inf."""
    e = biased.shape[-1]
    if n_group < 1 or e % n_group or not 1 <= topk_group <= n_group or e // n_group < 2 and n_group > 1:
        raise ValueError(f"{e} experts in n_group={n_group} groups keeping topk_group={topk_group}")
    if n_group == 1:
        return biased
    g = biased.reshape(*biased.shape[:-1], n_group, e // n_group)
    group_scores = stable_topk(g, 2)[0].sum(-1)
    keep = torch.zeros_like(group_scores, dtype=torch.bool)
    keep.scatter_(-1, stable_topk(group_scores, topk_group)[1], True)
    return torch.where(keep.unsqueeze(-1), g, torch.full_like(g, float("-inf"))).reshape(biased.shape)


def renormalise(w: torch.Tensor, eps: float) -> torch.Tensor:
    s = w.sum(-1, keepdim=True) + eps
    return torch.where(s > 0, w / torch.where(s > 0, s, torch.ones_like(s)), torch.zeros_like(w))


def route(logits: torch.Tensor, k: int, fn: str, bias: torch.Tensor | None = None, n_group: int = 1,
          topk_group: int = 1, renorm: bool = True, eps: float = 0.0, scale: float = 1.0
          ) -> tuple[torch.Tensor, torch.Tensor]:
    """(expert ids [..., k] int64, weights [..., k] f32) of router logits [..., experts]."""
    s = scores(logits, fn)
    ranked = s if bias is None else s + bias.float()
    ids = stable_topk(group_mask(ranked, n_group, topk_group), k)[1]
    w = s.gather(-1, ids)
    if renorm:
        w = renormalise(w, eps)
    return ids, w * scale


def hash_route(logits: torch.Tensor, token: torch.Tensor, table: torch.Tensor, fn: str, renorm: bool = True,
               eps: float = 0.0, scale: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Hash routing: ids = table[token] ([vocab, k] table), weights the scores there."""
    n = logits.shape[-1]
    ids = table[token.long()].long()
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= n):
        bad = ids[(ids < 0) | (ids >= n)][0].item()
        raise ValueError(f"hash table holds expert id {bad}, outside [0, {n})")
    w = scores(logits, fn).gather(-1, ids)
    if renorm:
        w = renormalise(w, eps)
    return ids, w * scale


# ---- torch operators: opaque to torch.compile (one node each, shapes from the fake implementations) ----
@torch.library.custom_op("megavm::route", mutates_args=())
def route_op(logits: torch.Tensor, k: int, fn: str, bias: torch.Tensor | None = None, n_group: int = 1,
             topk_group: int = 1, renorm: bool = True, eps: float = 0.0, scale: float = 1.0
             ) -> tuple[torch.Tensor, torch.Tensor]:
    """route() as an operator: (ids int64, weights f32), each [..., k]."""
    ids, w = route(logits, k, fn, bias, n_group, topk_group, renorm, eps, scale)
    return ids.contiguous(), w.contiguous()


@route_op.register_fake
def _(logits, k, fn, bias=None, n_group=1, topk_group=1, renorm=True, eps=0.0, scale=1.0):
    shape = (*logits.shape[:-1], k)
    return logits.new_empty(shape, dtype=torch.int64), logits.new_empty(shape, dtype=torch.float32)


@torch.library.custom_op("megavm::hash_route", mutates_args=())
def hash_route_op(logits: torch.Tensor, token: torch.Tensor, table: torch.Tensor, fn: str, renorm: bool = True,
                  eps: float = 0.0, scale: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """hash_route() as an operator: (ids int64, weights f32), each token's shape + [k]."""
    ids, w = hash_route(logits, token, table, fn, renorm, eps, scale)
    return ids.contiguous(), w.contiguous()


@hash_route_op.register_fake
def _(logits, token, table, fn, renorm=True, eps=0.0, scale=1.0):
    shape = (*token.shape, table.shape[-1])
    return logits.new_empty(shape, dtype=torch.int64), logits.new_empty(shape, dtype=torch.float32)
