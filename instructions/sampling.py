"""Sampling the next token: temperature, top-k and top-p over the logits with one uniform draw from a
counter-based generator. This is the specification the in-kernel sampling will be held to: the same
logits, seed and position give the same token on any device and in any launch.

The generator is Philox4x64-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC 2011):
the draw for position `pos` under seed `seed` is the first 64-bit word of the block at counter
(pos, 0, 0, 0) under key (seed mod 2^64, seed >> 64); its top 24 bits / 2^24 are the uniform u in
[0, 1), exact in f32. numpy's Philox bit generator is the same function (tests/instructions/
test_sampling.py holds the two to each other).

The token, given u (probabilities and their sums in f64):
1. temperature 0: greedy, the largest logit, ties to the lower id (no draw is used).
2. z = logits / temperature; the candidates are the top_k largest z (stable: ties to the lower id), in
   that order; top_k 0 means every token: in id order when top_p is 1 (plain temperature sampling,
   which needs no sort), else in rank order.
3. p = softmax(z) over the candidates; top-p keeps the shortest prefix whose probability sum reaches
   top_p (at least one token); the kept probabilities are used as they are (not renormalised: the draw
   is scaled to their sum instead, which picks the same token distribution).
4. The token is the first candidate whose running sum of kept p exceeds u * (sum of kept p); u = 0
   picks the first candidate.

The kernel (instructions/sample.py) samples over top_k <= MAX_KERNEL_TOP_K candidates, or every token
with top_p 1; check_kernel_params refuses the rest in one line.
"""
from __future__ import annotations

import math

import torch

from megavm.core.limits import MAX_TOPK
from megavm.instructions.routing import stable_topk

M0, M1 = 0xD2E7470EE14C6C93, 0xCA5A826395121157      # Philox4x64 multipliers
W0, W1 = 0x9E3779B97F4A7C15, 0xBB67AE8584CAA73B      # and Weyl key increments
MASK64 = (1 << 64) - 1
MAX_KERNEL_TOP_K = MAX_TOPK                           # candidates the kernel's SAMPLE ranks


def philox4x64(counter: tuple[int, int, int, int], key: tuple[int, int], rounds: int = 10) -> list[int]:
    """One Philox4x64 block: four 64-bit words of (counter, key)."""
    c, k = [x & MASK64 for x in counter], [x & MASK64 for x in key]
    for _ in range(rounds):
        p0, p1 = M0 * c[0], M1 * c[2]
        c = [(p1 >> 64) ^ c[1] ^ k[0], p1 & MASK64, (p0 >> 64) ^ c[3] ^ k[1], p0 & MASK64]
        k = [(k[0] + W0) & MASK64, (k[1] + W1) & MASK64]
    return c


def uniform(seed: int, pos: int) -> float:
    """The draw for position pos under seed: a multiple of 2^-24 in [0, 1)."""
    if not 0 <= seed < 1 << 128:
        raise ValueError(f"seed {seed} must be in [0, 2^128)")
    if pos < 0:
        raise ValueError(f"position {pos} must be >= 0")
    w = philox4x64((pos, 0, 0, 0), (seed & MASK64, seed >> 64))[0]
    return (w >> 40) * 2.0 ** -24


def check_params(temperature: float, top_k: int, top_p: float, vocab: int) -> None:
    """ValueError naming the setting a sampler cannot take."""
    if not (math.isfinite(temperature) and temperature >= 0):
        raise ValueError(f"temperature {temperature} must be finite and >= 0 (0: greedy)")
    if not 0 <= top_k <= vocab:
        raise ValueError(f"top_k {top_k} must be in [0, {vocab}] (0: every token)")
    if not (math.isfinite(top_p) and 0 < top_p <= 1):
        raise ValueError(f"top_p {top_p} must be in (0, 1]")


def check_kernel_params(temperature: float, top_k: int, top_p: float, vocab: int) -> None:
    """check_params, and what the kernel's SAMPLE takes: top_k up to MAX_KERNEL_TOP_K, or every token
    (top_k 0) with top_p 1."""
    check_params(temperature, top_k, top_p, vocab)
    if top_k > MAX_KERNEL_TOP_K:
        raise ValueError(f"top_k {top_k}: the kernel samples among at most {MAX_KERNEL_TOP_K} candidates")
    if top_k == 0 and top_p < 1 and temperature > 0:
        raise ValueError(f"top_p {top_p} with top_k 0 (every token): the kernel needs top_k in "
                         f"[1, {MAX_KERNEL_TOP_K}] for top-p")


def kept(logits: torch.Tensor, temperature: float, top_k: int = 0, top_p: float = 1.0
         ) -> tuple[torch.Tensor, torch.Tensor]:
    """(candidate ids, their kept probabilities (f64), unnormalised) for temperature > 0."""
    z = logits.double().reshape(-1) / temperature
    if top_k == 0 and top_p >= 1:
        ids = torch.arange(z.numel())
    else:
        _, ids = stable_topk(z, top_k or z.numel())
    p = torch.softmax(z[ids], dim=0)
    if top_p < 1:
        before = torch.cumsum(p, 0) - p                  # probability of the candidates ranked higher
        n = max(1, int((before < top_p).sum()))
        ids, p = ids[:n], p[:n]
    return ids, p


def sample(logits: torch.Tensor, temperature: float, top_k: int = 0, top_p: float = 1.0, u: float = 0.0) -> int:
    """The token for one draw u in [0, 1) (the module's rules; u from uniform())."""
    check_params(temperature, top_k, top_p, logits.numel())
    if temperature == 0:
        return int(stable_topk(logits.float().reshape(-1), 1)[1][0])
    ids, p = kept(logits, temperature, top_k, top_p)
    c = torch.cumsum(p, 0)
    i = int((c <= u * c[-1]).sum())
    return int(ids[min(i, len(ids) - 1)])


def sample_at(logits: torch.Tensor, temperature: float, top_k: int, top_p: float, seed: int, pos: int) -> int:
    """The token a seeded decode picks at position pos."""
    return sample(logits, temperature, top_k, top_p, uniform(seed, pos) if temperature > 0 else 0.0)
