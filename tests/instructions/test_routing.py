"""The routing spec (instructions/routing.py) against what nobody here wrote: transformers' router
modules (DeepSeek-V4's top-k and hash routers, DeepSeek-V3's grouped router, Qwen3-MoE's softmax
router) for scores and weights, a plain-Python sort for the tie rule, and adversarial rows from the
routers' published formulas. Tolerance on weights: 1e-6 relative (f32, the same formulas); ids exact.

Inputs for the transformers comparisons are resampled until adjacent ranked values differ by more
than 2e-6: torch.topk, which those modules use, is not tie-stable, so it is no oracle for ties."""
import math

import pytest
import torch

from megavm.instructions.routing import group_mask, hash_route, route, scores, softplus, stable_topk

transformers = pytest.importorskip("transformers")
GAP = 2e-6


def _separated(gen, experts, k, fn, bias=None, rows=8):
    """Router logits whose ranked (biased) scores have gaps > GAP around the top k."""
    while True:
        x = torch.randn(rows, experts, generator=gen) * 2
        s = scores(x, fn) + (0 if bias is None else bias)
        top = torch.sort(s, dim=-1, descending=True).values[:, :k + 1]
        if bool((top[:, :-1] - top[:, 1:] > GAP).all()):
            return x


def _by_id(ids, w):
    order = torch.argsort(ids, dim=-1)
    return ids.gather(-1, order), w.gather(-1, order)


def _v4_config(**kw):
    from transformers.models.deepseek_v4 import DeepseekV4Config
    return DeepseekV4Config(hidden_size=32, num_local_experts=16, num_experts_per_tok=4, vocab_size=50,
                            routed_scaling_factor=1.5, **kw)


def test_stable_topk_is_sorted_by_value_then_lower_index():
    """Against Python's sorted() on (-value, index): integer-valued rows full of ties, exact ids."""
    g = torch.Generator().manual_seed(0)
    for _ in range(50):
        v = torch.randint(-3, 4, (64,), generator=g).float()
        k = int(torch.randint(1, 65, (1,), generator=g))
        want = [i for _, i in sorted((-float(x), i) for i, x in enumerate(v))][:k]
        vals, ids = stable_topk(v, k)
        assert ids.tolist() == want and vals.tolist() == [float(v[i]) for i in want]
    assert stable_topk(torch.zeros(3, 10), 4)[1].tolist() == [[0, 1, 2, 3]] * 3, "all-zero logits: ids 0..k-1"
    with pytest.raises(ValueError, match="k=11 must be in"):
        stable_topk(torch.zeros(10), 11)


def test_nan_and_minus_inf_rank_last_in_that_order():
    v = torch.tensor([float("nan"), -math.inf, 0.5, 0.5, -1.0])
    assert stable_topk(v, 5)[1].tolist() == [2, 3, 4, 1, 0]


def test_sqrt_softplus_router_matches_deepseek_v4():
    from transformers.models.deepseek_v4.modeling_deepseek_v4 import DeepseekV4TopKRouter
    g = torch.Generator().manual_seed(1)
    cfg = _v4_config(scoring_func="sqrtsoftplus")
    r = DeepseekV4TopKRouter(cfg)
    torch.nn.init.normal_(r.weight, generator=g)
    r.e_score_correction_bias.copy_(torch.randn(16, generator=g) * 0.3)
    for _ in range(5):
        while True:
            h = torch.randn(8, 32, generator=g)
            logits = h @ r.weight.T
            s = scores(logits, "sqrt_softplus") + r.e_score_correction_bias
            top = torch.sort(s, dim=-1, descending=True).values[:, :5]
            if bool((top[:, :-1] - top[:, 1:] > GAP).all()):
                break
        _, w_hf, ids_hf = r(h)
        ids, w = route(logits, 4, "sqrt_softplus", bias=r.e_score_correction_bias, eps=1e-20, scale=1.5)
        (a, wa), (b, wb) = _by_id(ids, w), _by_id(ids_hf, w_hf)
        assert torch.equal(a, b)
        torch.testing.assert_close(wa, wb.float(), rtol=1e-6, atol=1e-7)
        assert torch.equal(ids, torch.sort(s, dim=-1, descending=True, stable=True).indices[:, :4]), \
            "ours come largest first"


# (transformers' V4 config names softmax as a scoring function, but its activation table has no softmax)
@pytest.mark.parametrize("fn, hf_fn", [("sigmoid", "sigmoid"), ("sqrt_softplus", "sqrtsoftplus")])
def test_hash_router_matches_deepseek_v4(fn, hf_fn):
    from transformers.models.deepseek_v4.modeling_deepseek_v4 import DeepseekV4HashRouter
    g = torch.Generator().manual_seed(2)
    r = DeepseekV4HashRouter(_v4_config(scoring_func=hf_fn))
    torch.nn.init.normal_(r.weight, generator=g)
    r.tid2eid.copy_(torch.stack([torch.randperm(16, generator=g)[:4] for _ in range(50)]))
    h, tok = torch.randn(6, 32, generator=g), torch.randint(0, 50, (6,), generator=g)
    _, w_hf, ids_hf = r(h, tok)
    ids, w = hash_route(h @ r.weight.T, tok, r.tid2eid, fn, eps=1e-20, scale=1.5)
    assert torch.equal(ids, ids_hf)
    torch.testing.assert_close(w, w_hf.float(), rtol=1e-6, atol=1e-7)
    with pytest.raises(ValueError, match="hash table holds expert id 16, outside"):
        hash_route(h @ r.weight.T, tok, torch.full((50, 4), 16), fn)


def test_grouped_sigmoid_router_matches_deepseek_v3():
    from transformers.models.deepseek_v3 import DeepseekV3Config
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3TopkRouter
    g = torch.Generator().manual_seed(3)
    cfg = DeepseekV3Config(hidden_size=32, n_routed_experts=32, num_experts_per_tok=6, n_group=4, topk_group=2,
                           norm_topk_prob=True, routed_scaling_factor=2.5)
    r = DeepseekV3TopkRouter(cfg)
    torch.nn.init.normal_(r.weight, generator=g)
    r.e_score_correction_bias.copy_(torch.randn(32, generator=g) * 0.1)
    checked = 0
    while checked < 20:
        h = torch.randn(1, 32, generator=g)
        logits = h @ r.weight.T
        biased = scores(logits, "sigmoid") + r.e_score_correction_bias
        gs = torch.sort(biased.view(1, 4, 8), dim=-1, descending=True).values[..., :2].sum(-1)
        gsort = torch.sort(gs, descending=True).values
        masked = torch.sort(group_mask(biased, 4, 2), descending=True).values
        if not (bool((gsort[:, :-1] - gsort[:, 1:] > GAP).all()) and bool((masked[:, :6] - masked[:, 1:7] > GAP).all())):
            continue
        _, w_hf, ids_hf = r(h)
        ids, w = route(logits, 6, "sigmoid", bias=r.e_score_correction_bias, n_group=4, topk_group=2, eps=1e-20,
                       scale=2.5)
        (a, wa), (b, wb) = _by_id(ids, w), _by_id(ids_hf, w_hf)
        assert torch.equal(a, b)
        torch.testing.assert_close(wa, wb.float(), rtol=1e-6, atol=1e-7)
        checked += 1


def test_softmax_router_matches_qwen3_moe():
    from transformers.models.qwen3_moe import Qwen3MoeConfig
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeTopKRouter
    g = torch.Generator().manual_seed(4)
    r = Qwen3MoeTopKRouter(Qwen3MoeConfig(hidden_size=32, num_experts=24, num_experts_per_tok=8, norm_topk_prob=True))
    torch.nn.init.normal_(r.weight, generator=g)
    for _ in range(5):
        while True:
            h = torch.randn(8, 32, generator=g)
            logits = h @ r.weight.T
            top = torch.sort(torch.softmax(logits, -1), dim=-1, descending=True).values[:, :9]
            if bool((top[:, :-1] - top[:, 1:] > GAP).all()):
                break
        out = r(h)
        w_hf, ids_hf = out[1], out[2]
        ids, w = route(logits, 8, "softmax")
        (a, wa), (b, wb) = _by_id(ids, w), _by_id(ids_hf, w_hf)
        assert torch.equal(a, b)
        torch.testing.assert_close(wa, wb.float(), rtol=1e-6, atol=1e-7)


def test_bias_ranks_but_never_weighs_and_scaling_follows_renormalisation():
    """Scores (2, 1) give weights (1.0, 0.5) at scale 1.5 (renormalise, then scale); a bias that flips
    the ranking changes which experts, never the weights' source."""
    two, one = math.log(math.exp(4) - 1), math.log(math.exp(1) - 1)     # sqrt(softplus(x)) = 2 and 1
    logits = torch.tensor([[one, two, -30.0]])
    ids, w = route(logits, 2, "sqrt_softplus", scale=1.5)
    assert ids.tolist() == [[1, 0]]
    torch.testing.assert_close(w, torch.tensor([[1.0, 0.5]]), rtol=1e-6, atol=0)
    ids, w = route(logits, 2, "sqrt_softplus", bias=torch.tensor([0.0, 0.0, 10.0]), scale=1.5)
    assert ids.tolist() == [[2, 1]], "the bias lifts expert 2 into the top 2"
    s2 = float(softplus(torch.tensor(-30.0)).sqrt())
    torch.testing.assert_close(w, torch.tensor([[1.5 * s2 / (s2 + 2), 1.5 * 2 / (s2 + 2)]]), rtol=1e-6, atol=0)


@pytest.mark.parametrize("fn", ["sigmoid", "sqrt_softplus"])
def test_scores_that_underflow_give_zero_weights_not_nan(fn):
    logits = torch.full((2, 12), -1e4)
    for eps in (0.0, 1e-20):
        ids, w = route(logits, 3, fn, eps=eps, scale=2.0)
        assert ids.tolist() == [[0, 1, 2]] * 2, "all scores 0: ties to the lower index"
        assert torch.equal(w, torch.zeros(2, 3)), f"{fn} {eps=}: {w}"
    assert torch.isfinite(softplus(torch.tensor([-1e4, 1e4, 0.0]))).all()


def test_router_operators_compile_without_graph_breaks():
    """megavm::route and megavm::hash_route inside a torch.compile'd function with fullgraph=True (a
    graph break raises), equal to the eager functions; the fake implementations give the shapes."""
    from megavm.instructions.routing import hash_route_op, route_op
    g = torch.Generator().manual_seed(5)
    w_router, bias = torch.randn(16, 32, generator=g), torch.randn(16, generator=g) * 0.1
    table = torch.stack([torch.randperm(16, generator=g)[:4] for _ in range(50)])

    def moe_gate(h, tok):
        logits = h @ w_router.T
        ids, w = route_op(logits, 4, "sqrt_softplus", bias, 1, 1, True, 1e-20, 1.5)
        hids, hw = hash_route_op(logits, tok, table, "sigmoid", True, 1e-20, 1.0)
        return ids, w * 2, hids, hw

    h, tok = torch.randn(3, 32, generator=g), torch.randint(0, 50, (3,), generator=g)
    compiled = torch.compile(moe_gate, fullgraph=True, backend="aot_eager")
    for got, want in zip(compiled(h, tok), moe_gate(h, tok)):
        assert torch.equal(got, want)
    logits = h @ w_router.T
    ids, w = route(logits, 4, "sqrt_softplus", bias, eps=1e-20, scale=1.5)
    assert torch.equal(compiled(h, tok)[0], ids) and torch.equal(compiled(h, tok)[1], w * 2)
    torch.library.opcheck(route_op, (logits, 4, "sqrt_softplus", bias, 1, 1, True, 1e-20, 1.5))
    torch.library.opcheck(hash_route_op, (logits, tok, table, "sigmoid", True, 1e-20, 1.0))
