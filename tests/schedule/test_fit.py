"""fit_chain: q/k/v tile counts that leave no partial behind its own layer's q/k/v stage."""
from dataclasses import replace

import pytest

from megavm.schedule.assign import assign, crowded_partials
from megavm.schedule.config import ScheduleConfig, resolve
from megavm.schedule.fit import FIT_TILE_WEIGHTS, chain_tasks, fit_chain
from megavm.schedule.lower import lower
from megavm.schedule.models import PRESETS
from megavm.schedule.plan import plan

CASES = ([(n, cap) for n in ("small", "llama-1b", "qwen3-1.7b", "moe-tiny") for cap in (288, 1024)]
         + [(n, 288) for n in ("llama-7b-32k", "qwen2.5-1.5b", "qwen3-30b-a3b", "gemma-2b")])


def _crowded(cfg, sc):
    p = lower(cfg, sc)
    return crowded_partials(p, assign(p, sc.n_sms, "round_robin"))[0]


@pytest.mark.parametrize("name, cap", CASES)
def test_one_layer_count_predicts_the_whole_program(name, cap):
    """A layer's partials are crowded in the whole program exactly when its one-layer chain outnumbers the
    queues: what fit_chain counts is what round robin does, at the defaults and at the fitted counts."""
    cfg = PRESETS[name]
    sc = ScheduleConfig(capacity=cap, n_sms=132)
    for s in (sc, fit_chain(cfg, replace(sc, fit_chain=True))):
        assert (chain_tasks(cfg, s) <= s.n_sms) == (_crowded(cfg, s) == 0), (name, cap, s.q_tiles, s.kv_tiles)


@pytest.mark.parametrize("name, cap", CASES)
def test_fit_leaves_no_crowding_where_it_can_and_no_taller_tiles(name, cap):
    cfg = PRESETS[name]
    sc = ScheduleConfig(capacity=cap, n_sms=132)
    lc, got = resolve(cfg, sc), fit_chain(cfg, replace(sc, fit_chain=True))
    assert not got.fit_chain and got.q_tiles <= lc.q_tiles and got.kv_tiles <= lc.kv_tiles
    gh, hd = cfg.group * cfg.head_dim, cfg.head_dim
    tallest = max(FIT_TILE_WEIGHTS, cfg.dim * max(-(-gh // lc.q_tiles), -(-hd // lc.kv_tiles)))
    assert cfg.dim * max(-(-gh // got.q_tiles), -(-hd // got.kv_tiles)) <= tallest
    if (got.q_tiles, got.kv_tiles) != (lc.q_tiles, lc.kv_tiles):      # it moved only to fit
        assert chain_tasks(cfg, got) <= 132 < chain_tasks(cfg, sc)


def test_fit_moves_the_crowded_presets_and_keeps_the_rest():
    """At capacity 288 (kernel_time's at ctx 128) with blocks of about one partial per SM (attn_direct=False):
    llama-1b drops to 1 k/v tile a KV head and qwen3-1.7b to 2; the 7b presets keep their counts, which
    fewer tiles would make taller than 128K weights. With the default one block a KV head (8 partials a layer)
    nothing is crowded and nothing moves."""
    one = ScheduleConfig(capacity=288, n_sms=132, fit_chain=True)
    for n in ("llama-1b", "qwen3-1.7b", "llama-7b-32k", "small"):
        lc = resolve(PRESETS[n], one)
        assert (fit_chain(PRESETS[n], one).q_tiles, fit_chain(PRESETS[n], one).kv_tiles) == (lc.q_tiles, lc.kv_tiles)
    sc = ScheduleConfig(capacity=288, n_sms=132, fit_chain=True, attn_direct=False)
    got = {n: (fit_chain(PRESETS[n], sc).q_tiles, fit_chain(PRESETS[n], sc).kv_tiles)
           for n in ("llama-1b", "qwen3-1.7b", "llama-7b-32k", "small")}
    assert got == {"llama-1b": (8, 1), "qwen3-1.7b": (4, 2), "llama-7b-32k": (10, 3), "small": (14, 5)}, got


def test_counts_the_caller_set_and_whole_head_tiles_stay():
    cfg = PRESETS["llama-1b"]
    sc = ScheduleConfig(capacity=288, n_sms=132, fit_chain=True, kv_tiles=3)
    assert fit_chain(cfg, sc) == replace(sc, fit_chain=False)
    q3 = PRESETS["qwen3-1.7b"]
    sc = ScheduleConfig(capacity=288, n_sms=132, fit_chain=True, split_head_norm=False)
    assert fit_chain(q3, sc) == replace(sc, fit_chain=False)


def test_plan_applies_it_and_the_program_validates():
    cfg = PRESETS["llama-1b"]
    b = plan(cfg, ScheduleConfig(capacity=288, n_sms=132, fit_chain=True, attn_direct=False)).checked()
    assert crowded_partials(b.program, b.queues)[0] == 0
    d = plan(cfg, ScheduleConfig(capacity=288, n_sms=132, attn_direct=False))
    assert crowded_partials(d.program, d.queues)[0] > 0


def test_fitted_program_decodes_what_the_default_does():
    """ReferenceVM runs a two-layer, small-vocabulary qwen3-1.7b shape (its q/k/v stage crowded at
    capacity 288) with the default and the fitted tile counts: the same tokens, and logits equal to f32
    rounding (each output row is one tile's whole dot product either way)."""
    import torch

    from megavm.schedule.weights import program_weights, random_hf_weights
    from megavm.vm.pack import pack
    from megavm.vm.reference import ReferenceVM
    from megavm.vm.verify import greedy, reference_step
    cfg = replace(PRESETS["qwen3-1.7b"], n_layers=2, vocab=512)
    w = program_weights(cfg, random_hf_weights(cfg, torch.float32, seed=3))
    runs = []
    for fit in (False, True):
        sc = ScheduleConfig(dtype="f32", capacity=288, n_sms=132, fit_chain=fit, attn_direct=False)
        b = plan(cfg, sc).checked()
        runs.append((greedy(reference_step(ReferenceVM(pack(b.program, b.queues), w)), [5, 7], 3), b))
    (base, b0), (fit, b1) = runs
    assert crowded_partials(b0.program, b0.queues)[0] > 0 == crowded_partials(b1.program, b1.queues)[0]
    assert fit.tokens == base.tokens
    for a, c in zip(fit.logits, base.logits):
        assert torch.allclose(a, c, rtol=0, atol=1e-5 * float(c.abs().max())), float((a - c).abs().max())
