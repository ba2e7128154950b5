"""The sampling spec (instructions/sampling.py): its generator against numpy's Philox (a library
nobody here wrote), its token rule against an inverse-CDF oracle written here in f64 Python, and its
distribution over many seeds against softmax(logits / T) restricted to the top-k / top-p set by a
chi-square test at significance 1e-4."""
import math

import numpy as np
import pytest
import torch

from megavm.instructions.sampling import MASK64, check_params, philox4x64, sample, sample_at, uniform


def test_philox_is_numpys():
    """numpy's Philox (Philox4x64-10) advances its counter before a block: counter c - 1 yields ours at c."""
    g = np.random.default_rng(0)
    for _ in range(20):
        key = [int(x) for x in g.integers(0, 2 ** 63, 2, dtype=np.uint64)]
        c = [int(x) for x in g.integers(1, 2 ** 63, 4, dtype=np.uint64)]
        bg = np.random.Philox(counter=[c[0] - 1, c[1], c[2], c[3]], key=key)
        assert [int(x) for x in bg.random_raw(4)] == philox4x64(tuple(c), tuple(key))
    # the counter's carry: numpy at (2^64 - 1, 0, 0, 0) steps to (0, 1, 0, 0)
    bg = np.random.Philox(counter=np.array([MASK64, 0, 0, 0], dtype=np.uint64), key=[3, 4])
    assert [int(x) for x in bg.random_raw(4)] == philox4x64((0, 1, 0, 0), (3, 4))


def test_uniform_is_a_24_bit_draw_per_seed_and_position():
    draws = [uniform(seed, pos) for seed in range(4) for pos in range(50)]
    assert all(0 <= u < 1 and (u * 2 ** 24).is_integer() for u in draws)
    assert len(set(draws)) == len(draws)
    assert uniform(123, 7) == uniform(123, 7)
    with pytest.raises(ValueError, match="position -1"):
        uniform(1, -1)


def _oracle(logits, T, top_k, top_p, u):
    """Inverse CDF in f64: rank by (-z, id) (id order for every token at top_p 1), softmax over the top
    k, the top-p prefix, then the draw."""
    z = [float(x) / T for x in logits]
    order = [i for _, i in sorted((-v, i) for i, v in enumerate(z))][:top_k or len(z)]
    if top_k == 0 and top_p >= 1:          # plain temperature sampling walks the ids in order
        order = list(range(len(z)))
    m = max(z[i] for i in order)
    e = [math.exp(z[i] - m) for i in order]
    p = [x / sum(e) for x in e]
    if top_p < 1:
        n, acc = 0, 0.0
        while n < len(p) and acc < top_p:
            acc += p[n]
            n += 1
        order, p = order[:max(1, n)], p[:max(1, n)]
    total, acc = sum(p), 0.0
    for i, q in zip(order, p):
        acc += q
        if acc > u * total:
            return i, min(abs(acc - u * total), abs(acc - q - u * total))
    return order[-1], 1.0


@pytest.mark.parametrize("T, top_k, top_p", [(1.0, 0, 1.0), (0.7, 5, 1.0), (1.3, 0, 0.8), (0.9, 20, 0.5), (2.0, 3, 0.95)])
def test_token_is_the_inverse_cdf_of_the_kept_distribution(T, top_k, top_p):
    g = torch.Generator().manual_seed(int(T * 10) + top_k)
    checked = 0
    for _ in range(400):
        logits = torch.randn(40, generator=g) * 2
        u = float(torch.rand(1, generator=g))
        want, margin = _oracle(logits, T, top_k, top_p, u)
        if margin < 1e-5:                 # a draw on a boundary: f32 and f64 may fall either side
            continue
        assert sample(logits, T, top_k, top_p, u) == want, f"{u=}"
        checked += 1
    assert checked > 350


def test_greedy_and_top1_take_the_largest_logit_ties_to_the_lower_id():
    logits = torch.tensor([0.5, 2.0, -1.0, 2.0, 1.9])
    assert sample(logits, 0.0) == 1 and sample_at(logits, 0.0, 0, 1.0, seed=9, pos=4) == 1
    for u in (0.0, 0.5, 0.999):
        assert sample(logits, 1.0, top_k=1, u=u) == 1
        assert sample(logits, 0.5, top_p=1e-6, u=u) == 1, "top-p keeps at least the first candidate"


def _wilson_hilferty(df: int, z: float = 3.719) -> float:
    """The chi-square critical value for significance 1e-4 (z = 3.719), by Wilson and Hilferty's cube
    approximation (within 1% for df >= 3)."""
    return df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3


@pytest.mark.parametrize("T, top_k, top_p", [(1.0, 0, 1.0), (0.8, 6, 1.0), (1.2, 0, 0.85), (0.9, 7, 0.9)])
def test_seeded_draws_follow_the_restricted_softmax(T, top_k, top_p):
    logits = torch.tensor([1.2, -0.3, 0.8, 2.0, 0.1, -1.5, 1.9, 0.5, -0.7, 1.0])
    z = [float(x) / T for x in logits]
    order = [i for _, i in sorted((-v, i) for i, v in enumerate(z))][:top_k or 10]
    e = [math.exp(z[i]) for i in order]
    p = [x / sum(e) for x in e]
    if top_p < 1:
        n, acc = 0, 0.0
        while acc < top_p:
            acc += p[n]
            n += 1
        order, p = order[:n], [x / sum(p[:n]) for x in p[:n]]
    N = 20000
    counts = {}
    for seed in range(N):
        t = sample_at(logits, T, top_k, top_p, seed=seed, pos=11)
        counts[t] = counts.get(t, 0) + 1
    assert set(counts) <= set(order), f"tokens outside the kept set: {set(counts) - set(order)}"
    chi2 = sum((counts.get(i, 0) - N * q) ** 2 / (N * q) for i, q in zip(order, p))
    df = len(order) - 1
    assert chi2 < _wilson_hilferty(df), f"chi-square {chi2:.1f} over {df} degrees of freedom"


@pytest.mark.parametrize("args, words", [((-0.5, 0, 1.0), "temperature -0.5 must be finite and >= 0"),
                                         ((float("nan"), 0, 1.0), "temperature nan"),
                                         ((1.0, 0, 0.0), "top_p 0.0 must be in (0, 1]"),
                                         ((1.0, 0, 1.5), "top_p 1.5"),
                                         ((1.0, -1, 1.0), "top_k -1 must be in [0, 10]"),
                                         ((1.0, 11, 1.0), "top_k 11")])
def test_bad_settings_are_named(args, words):
    with pytest.raises(ValueError, match=words.replace("(", r"\(").replace("[", r"\[").replace(")", r"\)").replace("]", r"\]")):
        check_params(*args, vocab=10)


@pytest.mark.parametrize("T, top_k, top_p", [(1.0, 0, 1.0), (0.7, 5, 1.0), (1.3, 0, 0.8), (0.9, 20, 0.5),
                                             (2.0, 3, 0.95), (0.6, 32, 0.9)])
def test_kept_set_and_probabilities_match_transformers_warpers(T, top_k, top_p):
    """An oracle nobody here wrote: transformers' temperature, top-k and top-p logits warpers, applied in
    the order its generate() applies them, then a softmax, give the same kept tokens and, renormalised,
    the same probabilities (f64 relative 1e-12) as kept(). Logits are drawn without ties (torch.topk,
    inside the warper, breaks ties its own way), and rows whose top-p cut falls within 1e-9 of a
    cumulative sum are drawn again (both sides round there)."""
    warpers = pytest.importorskip("transformers.generation.logits_process")
    from megavm.instructions.sampling import kept
    chain = [warpers.TemperatureLogitsWarper(T)]
    if top_k:
        chain.append(warpers.TopKLogitsWarper(top_k))
    if top_p < 1:
        chain.append(warpers.TopPLogitsWarper(top_p))
    g = torch.Generator().manual_seed(top_k * 100 + int(T * 10))
    checked = 0
    for _ in range(60):
        logits = torch.randn(200, generator=g, dtype=torch.float64) * 3
        ids, p = kept(logits, T, top_k, top_p)
        if top_p < 1:                    # the candidates' probabilities in rank order, summed
            ranked = torch.softmax((logits / T)[torch.argsort(logits, descending=True)[:top_k or 200]], 0)
            if (torch.cumsum(ranked, 0) - top_p).abs().min() < 1e-9:
                continue
        scores = logits.reshape(1, -1).clone()
        for w in chain:
            scores = w(torch.zeros(1, 1, dtype=torch.long), scores)
        theirs = torch.softmax(scores[0], 0)
        keep = torch.nonzero(theirs > 0).flatten()
        assert sorted(ids.tolist()) == keep.tolist()
        mine = torch.zeros_like(theirs)
        mine[ids] = p / p.sum()
        assert torch.allclose(mine, theirs, rtol=1e-12, atol=0)
        checked += 1
    assert checked > 50
