"""Lowering: counters, task counts, exact tile coverage and fine-grained waits."""
import math
from dataclasses import replace
from collections import Counter as Count

import pytest
import torch

from megavm.core.types import BufferKind
from megavm.instructions import Op
from megavm.schedule.config import SPLIT_Q_ROWS, ScheduleConfig
from megavm.schedule.lower import lower, resolve
from megavm.schedule.models import PRESETS, ModelConfig

ODD = ModelConfig(dim=96, n_layers=3, n_heads=6, n_kv_heads=3, head_dim=16, ffn_dim=200, vocab=1001)
# (one KV block a head, attn_direct, at every capacity here but small's 2048 and llama-1b's 4096)
CASES = [("tiny", 8, 64), ("tiny", 132, 64), ("odd", 7, 100), ("small", 132, 512), ("small", 132, 2048),
         ("llama-1b", 132, 512), ("llama-1b", 114, 4096)]


def direct(lc) -> bool:
    """One KV block a head whose partial writes the attention output (no part counters, no combines)."""
    return lc.attn_direct and not lc.fuse_combine and lc.kv_block >= lc.capacity


def config(name):
    return ODD if name == "odd" else PRESETS[name]


@pytest.fixture(scope="module", params=CASES, ids=[f"{m}-sms{s}-cap{c}" for m, s, c in CASES])
def case(request):
    name, n_sms, cap = request.param
    cfg = config(name)
    lc = ScheduleConfig(dtype="bf16", capacity=cap, n_sms=n_sms)
    return name, cfg, resolve(cfg, lc), lower(cfg, lc)


def test_counters(case):
    name, cfg, lc, p = case
    want = ["x.0"]
    for l in range(cfg.n_layers):
        want += [f"L{l}.qkv.h{h}" for h in range(cfg.n_kv_heads)]
        want += [] if direct(lc) else [f"L{l}.part.h{h}" for h in range(cfg.n_kv_heads)]
        want += [f"L{l}.attn", f"L{l}.mid", f"L{l}.ffn", f"x.{l + 1}"]
    want += ["lm", "done"]
    assert not lc.fuse_combine
    assert [c.name for c in p.counters] == want, f"{name}: counters"
    heads = cfg.n_kv_heads if direct(lc) else 2 * cfg.n_kv_heads
    assert len(p.counters) == 1 + cfg.n_layers * (heads + 4) + 2


def test_task_counts(case):
    name, cfg, lc, p = case
    nblk = math.ceil(lc.capacity / lc.kv_block)
    L = cfg.n_layers
    want = {
        Op.EMBED: math.ceil(cfg.dim / lc.embed_cols),
        Op.RMS_LINEAR_ROPE: L * cfg.n_kv_heads * lc.q_tiles,
        Op.RMS_LINEAR_KV: L * 2 * cfg.n_kv_heads * lc.kv_tiles,
        Op.ATTN_PARTIAL: L * cfg.n_kv_heads * nblk,
        Op.ATTN_COMBINE: 0 if lc.fuse_combine or direct(lc) else L * cfg.n_kv_heads,
        Op.LINEAR_RESIDUAL: L * (math.ceil(cfg.dim / lc.o_rows) + math.ceil(cfg.dim / lc.down_rows)),
        Op.RMS_GLU: L * math.ceil(cfg.ffn_dim / lc.ffn_rows),
        Op.RMS_LINEAR_ARGMAX: math.ceil(cfg.vocab / lc.lm_rows),
        Op.ARGMAX: 1,
    }
    got = Count(Op(t.opcode) for t in p.tasks)
    want = {op: n for op, n in want.items() if n}
    assert dict(got) == want, f"{name} {lc=}"
    assert lc.kv_block * nblk >= lc.capacity


def _rows_of(p, op, out_name):
    out = p.buffer_id(out_name)
    return sorted((t.params["row0"], t.params["row0"] + t.params["nrows"])
                  for t in p.tasks if t.opcode == op and t.outputs[0] == out)


def _assert_exact_cover(spans, n, what):
    assert spans, f"{what}: no tiles"
    assert spans[0][0] == 0 and spans[-1][1] == n, f"{what}: tiles {spans[0]}..{spans[-1]} do not span [0, {n})"
    gaps = [(a, b) for a, b in zip(spans, spans[1:]) if a[1] != b[0]]
    assert not gaps, f"{what}: tiles overlap or leave gaps at {gaps[:3]}"


def test_tiles_cover_every_row_once(case):
    name, cfg, lc, p = case
    hd = cfg.head_dim
    for l in range(cfg.n_layers):
        _assert_exact_cover(_rows_of(p, Op.RMS_LINEAR_ROPE, f"q.{l}"), cfg.n_heads * hd, f"{name} L{l} q")
        _assert_exact_cover(_rows_of(p, Op.RMS_LINEAR_KV, f"k_cache.{l}"), cfg.n_kv_heads * hd, f"{name} L{l} k")
        _assert_exact_cover(_rows_of(p, Op.RMS_LINEAR_KV, f"v_cache.{l}"), cfg.n_kv_heads * hd, f"{name} L{l} v")
        _assert_exact_cover(_rows_of(p, Op.LINEAR_RESIDUAL, f"mid.{l}"), cfg.dim, f"{name} L{l} o")
        _assert_exact_cover(_rows_of(p, Op.RMS_GLU, f"ffn.{l}"), cfg.ffn_dim, f"{name} L{l} gate/up")
        _assert_exact_cover(_rows_of(p, Op.LINEAR_RESIDUAL, f"x.{l + 1}"), cfg.dim, f"{name} L{l} down")
    _assert_exact_cover(_rows_of(p, Op.RMS_LINEAR_ARGMAX, "logits"), cfg.vocab, f"{name} lm_head")
    emb = sorted((t.params["col0"], t.params["col0"] + t.params["ncols"]) for t in p.tasks if t.opcode == Op.EMBED)
    _assert_exact_cover(emb, cfg.dim, f"{name} embed")


def test_every_wait_is_an_all_join(case):
    name, cfg, lc, p = case
    producers = p.producers()
    for i, t in enumerate(p.tasks):
        for w in t.waits:
            n = len(producers[w.counter])
            assert w.threshold == n, (f"{name}: {p.describe_task(i)} waits for {p.counters[w.counter].name} "
                                      f">= {w.threshold}, which has {n} producers")


def test_attention_waits_only_for_its_kv_head(case):
    """ATTN_PARTIAL of KV head h waits only on L{l}.qkv.h{h}, whose producers are exactly the q tiles of
    head group h and the k/v tiles of head h."""
    name, cfg, lc, p = case
    hd, G = cfg.head_dim, cfg.group
    cid = {c.name: i for i, c in enumerate(p.counters)}
    producers = p.producers()
    by_output: dict[int, list[int]] = {}
    for i, t in enumerate(p.tasks):
        by_output.setdefault(t.outputs[0], []).append(i)
    for l in range(cfg.n_layers):
        q, k, v = p.buffer_id(f"q.{l}"), p.buffer_id(f"k_cache.{l}"), p.buffer_id(f"v_cache.{l}")
        for h in range(cfg.n_kv_heads):
            c = cid[f"L{l}.qkv.h{h}"]
            want = set()
            for buf, lo, hi in ((q, h * G * hd, (h + 1) * G * hd), (k, h * hd, (h + 1) * hd), (v, h * hd, (h + 1) * hd)):
                for i in by_output[buf]:
                    t = p.tasks[i]
                    assert t.opcode in (Op.RMS_LINEAR_ROPE, Op.RMS_LINEAR_KV), f"{name}: {p.describe_task(i)} writes q/k/v"
                    if lo <= t.params["row0"] and t.params["row0"] + t.params["nrows"] <= hi:
                        want.add(i)
            assert set(producers[c]) == want, f"{name} L{l} h{h}: producers {sorted(producers[c])} != {sorted(want)}"
            partials = [p.tasks[i] for i in by_output[p.buffer_id(f"attn.{l}" if direct(lc) else f"part.{l}")]
                        if p.tasks[i].opcode == Op.ATTN_PARTIAL and p.tasks[i].params["kv_head"] == h]
            assert len(partials) == math.ceil(lc.capacity / lc.kv_block)
            for t in partials:
                assert [(w.counter, w.threshold) for w in t.waits] == [(c, len(want))], \
                    f"{name} {t.label}: waits {t.waits}, expected only L{l}.qkv.h{h} >= {len(want)}"
            if direct(lc):                  # the head's one partial signals L{l}.attn
                assert [p.counters[t.signal].name for t in partials] == [f"L{l}.attn"]
                continue
            combine = [p.tasks[i] for i in by_output[p.buffer_id(f"attn.{l}")] if p.tasks[i].params["kv_head"] == h]
            assert len(combine) == 1 and [p.counters[w.counter].name for w in combine[0].waits] == [f"L{l}.part.h{h}"]


def test_fused_combine_waits_for_every_partial():
    cfg = PRESETS["llama-1b"]
    lc = resolve(cfg, ScheduleConfig(capacity=512, fuse_combine=True))
    p = lower(cfg, lc)
    nblk = math.ceil(lc.capacity / lc.kv_block)
    assert not any(t.opcode == Op.ATTN_COMBINE for t in p.tasks)
    for l in range(cfg.n_layers):
        o = [t for t in p.tasks if t.outputs[0] == p.buffer_id(f"mid.{l}")]
        assert len(o) == math.ceil(cfg.dim / lc.o_rows)
        for t in o:
            assert t.opcode == Op.LINEAR_RESIDUAL and p.buffers[t.inputs[0]].name == f"part.{l}"
            assert [(p.counters[w.counter].name, w.threshold) for w in t.waits] == [(f"L{l}.part", cfg.n_kv_heads * nblk)]


def test_one_program_serves_every_step(case):
    name, cfg, lc, p = case
    inputs = {p.buffers[i].name for i in p.buffers_of_kind(BufferKind.INPUT)}
    outputs = {p.buffers[i].name for i in p.buffers_of_kind(BufferKind.OUTPUT)}
    assert inputs == {"token", "pos"} and outputs == {"logits", "next_token"}
    assert p.meta["inputs"] == ["token", "pos"] and p.meta["schedule"]["capacity"] == lc.capacity
    for l in range(cfg.n_layers):
        assert p.buffers[p.buffer_id(f"k_cache.{l}")].shape == (cfg.n_kv_heads, lc.capacity, cfg.head_dim)


def test_dtype_sets_weights_and_cache_only():
    for dt in ("f32", "bf16"):
        p = lower(PRESETS["tiny"], ScheduleConfig(dtype=dt, capacity=32, n_sms=4))
        for b in p.buffers:
            want = {BufferKind.WEIGHT: dt, BufferKind.KV_CACHE: dt}.get(b.kind)
            if want and b.name != "rope_freqs":
                assert b.dtype.name.lower() == want, f"{dt=}: {b.name} is {b.dtype.name}"
            if b.kind == BufferKind.ACTIVATION:
                assert b.dtype.name in ("F32", "I32"), f"{dt=}: activation {b.name} is {b.dtype.name}"


def test_bad_configs_refused():
    with pytest.raises(ValueError, match="dtype='i32' must be f32 or bf16"):
        lower(PRESETS["tiny"], ScheduleConfig(dtype="i32"))
    with pytest.raises(ValueError, match="dtype='f16' must be f32 or bf16"):
        lower(PRESETS["tiny"], ScheduleConfig(dtype="f16"))
    with pytest.raises(ValueError, match="unknown dtype"):
        lower(PRESETS["tiny"], ScheduleConfig(dtype="f64"))
    with pytest.raises(ValueError, match="qkv_rows=12 must be even and divide head_dim=16"):
        lower(PRESETS["tiny"], ScheduleConfig(dtype="f32", qkv_rows=12))


UNFUSED = dict(fuse_norm=False, fuse_rope=False, fuse_residual=False, fuse_argmax=False)


def test_unfused_lowering_has_a_task_per_unfused_step():
    """Each fusion switched off: RMSNORM tasks (two per layer and the final norm), a ROPE and two
    KV_APPENDs per KV head behind plain q/k/v tiles, LINEAR tiles with one ADD per residual, and an
    ARGMAX over the logits after plain LM-head tiles; every projection then skips its prologue norm."""
    cfg = PRESETS["llama-1b"]
    lc = resolve(cfg, ScheduleConfig(dtype="bf16", capacity=512, **UNFUSED))
    p = lower(cfg, lc)
    L, KVH = cfg.n_layers, cfg.n_kv_heads
    got = Count(Op(t.opcode) for t in p.tasks)
    lm_tiles = math.ceil(cfg.vocab / lc.lm_rows)
    assert got[Op.RMSNORM] == 2 * L + 1
    assert got[Op.ROPE] == L * KVH and got[Op.KV_APPEND] == 2 * L * KVH
    assert got[Op.RMS_LINEAR] == L * KVH * (lc.q_tiles + 2 * lc.kv_tiles) + lm_tiles
    assert got[Op.LINEAR] == L * (math.ceil(cfg.dim / lc.o_rows) + math.ceil(cfg.dim / lc.down_rows))
    assert got[Op.ADD] == 2 * L and got[Op.ARGMAX] == 1
    for op in (Op.RMS_LINEAR_ROPE, Op.RMS_LINEAR_KV, Op.LINEAR_RESIDUAL, Op.RMS_LINEAR_ARGMAX):
        assert got[op] == 0, op.name
    assert all(t.params["norm"] == 0 for t in p.tasks if "norm" in t.params)
    argmax = next(t for t in p.tasks if t.opcode == Op.ARGMAX)
    assert p.buffers[argmax.inputs[0]].name == "logits"
    with pytest.raises(ValueError, match="fuse_combine needs fuse_residual"):
        lower(cfg, ScheduleConfig(fuse_combine=True, fuse_residual=False))


def test_counter_and_split_ablations_compute_the_same_step():
    """One counter per layer (head_counters=False), one partial per KV head writing the attention output
    (the default at this capacity), the same block through a combine (attn_direct=False), three blocks and
    their combine (kv_block=16), the combine fused into the o-projection, combines of a range of a group's
    query heads (combine_q_heads), q on a counter of its own (q_counter) and every unfused form of a fusion
    are valid programs that ReferenceVM runs to the default program's logits."""
    from megavm.schedule.assign import assign
    from megavm.schedule.validate import check
    from megavm.schedule.weights import program_weights, random_hf_weights
    from megavm.vm.pack import pack
    from megavm.vm.reference import ReferenceVM
    cfg = PRESETS["tiny"]
    w = program_weights(cfg, random_hf_weights(cfg, torch.float32, seed=3))
    outs = []
    for kw in ({}, {"head_counters": False}, {"attn_direct": False}, {"kv_block": 16}, {"fuse_combine": True},
               {"fuse_combine": True, "head_counters": False}, {"fuse_norm": False}, {"fuse_rope": False},
               {"fuse_residual": False}, {"fuse_argmax": False}, {**UNFUSED, "head_counters": False},
               {"combine_q_heads": 1, "attn_direct": False},
               {"combine_q_heads": 1, "head_counters": False, "attn_direct": False},
               {"q_counter": True}, {"q_counter": True, "head_counters": False, "attn_direct": False},
               {"q_counter": True, **UNFUSED}):
        p = lower(cfg, ScheduleConfig(dtype="f32", capacity=48, n_sms=6, **kw))
        if "combine_q_heads" in kw:         # one combine a query head, not the default's one a KV head
            assert sum(t.opcode == Op.ATTN_COMBINE for t in p.tasks) == cfg.n_layers * cfg.n_heads
        q = assign(p, 6)
        check(p, q)
        vm = ReferenceVM(pack(p, q), w)
        for pos, tok in enumerate([5, 9, 2]):
            out = vm.step({"token": tok, "pos": pos})
        outs.append(out["logits"])
    for o in outs[1:]:
        torch.testing.assert_close(o, outs[0], rtol=1e-5, atol=1e-6)


QK = ModelConfig(dim=128, n_layers=2, n_heads=8, n_kv_heads=2, head_dim=32, ffn_dim=256, vocab=301, family="qwen3",
                 qk_norm=True, qkv_bias=True)


def test_head_norms_split_over_short_tiles_and_finishing_tasks():
    """Qwen3's per-head q/k norms: by default plain q/k tiles of any height, then per KV head ROPE tasks
    (whole query heads, at most a tile's rows each) and one KV_APPEND (the key) that norm, rotate and
    append; the value tiles append themselves. split_head_norm=False, or LoRA on q, gives whole-head
    tiles that norm themselves."""
    cfg = PRESETS["qwen3-1.7b"]
    hd, G, KVH = cfg.head_dim, cfg.group, cfg.n_kv_heads
    sc = ScheduleConfig(dtype="bf16", capacity=512, n_sms=132)
    lc, p = resolve(cfg, sc), lower(cfg, sc)
    assert lc.qkv_rows < hd, "q/k tiles are not held to whole heads"
    got = Count(Op(t.opcode) for t in p.tasks)
    L = cfg.n_layers
    assert got[Op.RMS_LINEAR_ROPE] == 0
    assert got[Op.RMS_LINEAR] == L * KVH * (lc.q_tiles + lc.kv_tiles)
    assert got[Op.RMS_LINEAR_KV] == L * KVH * lc.kv_tiles
    assert got[Op.ROPE] == L * KVH * math.ceil(G * hd / 256) and got[Op.KV_APPEND] == L * KVH
    for l in range(L):
        _assert_exact_cover(_rows_of(p, Op.RMS_LINEAR, f"q_raw.{l}"), cfg.n_heads * hd, f"L{l} q tiles")
        _assert_exact_cover(_rows_of(p, Op.RMS_LINEAR, f"k_raw.{l}"), KVH * hd, f"L{l} k tiles")
        _assert_exact_cover(_rows_of(p, Op.ROPE, f"q.{l}"), cfg.n_heads * hd, f"L{l} q finish")
        _assert_exact_cover(_rows_of(p, Op.RMS_LINEAR_KV, f"v_cache.{l}"), KVH * hd, f"L{l} v")
    q_norm = {p.buffer_id(f"layers.{l}.q_norm") for l in range(L)}
    k_norm = {p.buffer_id(f"layers.{l}.k_norm") for l in range(L)}
    for t in p.tasks:
        if t.opcode == Op.ROPE:
            assert t.inputs[4] in q_norm and t.params["row0"] % hd == 0 and t.params["nrows"] % hd == 0
            assert t.params["eps"] == cfg.norm_eps
        if t.opcode == Op.KV_APPEND:
            assert t.inputs[4] in k_norm and t.params["rope"] == 1 and t.params["nrows"] == hd
    producers = p.producers()
    for i, t in enumerate(p.tasks):          # every wait is an all-join, attention's included
        for w in t.waits:
            assert w.threshold == len(producers[w.counter]), p.describe_task(i)
    for kw in ({"split_head_norm": False}, {"lora_adapters": 1, "lora_rank": 4, "lora_targets": ("q", "v")}):
        lc, p = resolve(cfg, ScheduleConfig(capacity=512, n_sms=132, **kw)), lower(cfg, ScheduleConfig(capacity=512, n_sms=132, **kw))
        assert lc.q_tiles == G and lc.kv_tiles == 1, kw
        assert all(t.params["nrows"] % hd == 0 for t in p.tasks if t.opcode == Op.RMS_LINEAR_ROPE), kw
        assert not any(t.opcode in (Op.ROPE, Op.KV_APPEND) for t in p.tasks), kw


@pytest.mark.parametrize("q_tiles", [0, 3, 40])
def test_split_q_tiles_fall_within_their_finishers_rows(q_tiles):
    """A group of 8 query heads of head_dim 128 is finished by four ROPE tasks of 256 rows each: the q
    tiles are cut within each one's rows, and each ROPE waits on exactly the tiles it reads (so with
    tagged rows the wait is polled). By default the q tiles are 64 rows (SPLIT_Q_ROWS); a q_tiles set
    alone is honoured (kv_tiles from the SM count), rounded up to whole tiles per ROPE."""
    cfg = replace(PRESETS["qwen3-30b-a3b"], n_layers=1)
    sc = ScheduleConfig(dtype="bf16", capacity=256, n_sms=132, q_tiles=q_tiles)
    lc, p = resolve(cfg, sc), lower(cfg, sc)
    G, hd, KVH = cfg.group, cfg.head_dim, cfg.n_kv_heads
    assert lc.q_tiles == (q_tiles or G * hd // SPLIT_Q_ROWS) and lc.kv_tiles == resolve(cfg, replace(sc, q_tiles=0)).kv_tiles
    producers = p.producers()
    ropes = [i for i, t in enumerate(p.tasks) if t.opcode == Op.ROPE]
    assert len(ropes) == KVH * 4
    tiles = {i: t for i, t in enumerate(p.tasks) if t.opcode == Op.RMS_LINEAR and p.buffers[t.outputs[0]].name == "q_raw.0"}
    assert len(tiles) == KVH * 4 * -(-lc.q_tiles // 4)
    for i in ropes:
        r = p.tasks[i]
        lo, hi = r.params["row0"], r.params["row0"] + r.params["nrows"]
        (w,) = r.waits
        assert w.polled and w.threshold == len(producers[w.counter])
        assert {j for j, t in tiles.items() if lo <= t.params["row0"] < hi} == set(producers[w.counter])
        assert all(t.params["row0"] + t.params["nrows"] <= hi for j, t in tiles.items() if lo <= t.params["row0"] < hi)
    _assert_exact_cover(_rows_of(p, Op.RMS_LINEAR, "q_raw.0"), cfg.n_heads * hd, "q tiles")


def test_head_norm_lowerings_compute_the_same_step():
    """Whole-head tiles, short tiles with finishing tasks (the default) and the unfused RoPE (which
    now carries the biases and head norms too) run to the same logits on ReferenceVM, with q/k/v
    biases and per-head norms both present."""
    from megavm.schedule.assign import assign
    from megavm.schedule.validate import check
    from megavm.schedule.weights import program_weights, random_hf_weights
    from megavm.vm.pack import pack
    from megavm.vm.reference import ReferenceVM
    w = program_weights(QK, random_hf_weights(QK, torch.float32, seed=5))
    outs = []
    for kw in ({"split_head_norm": False}, {}, {"fuse_rope": False}, {**UNFUSED, "head_counters": False},
               {"q_counter": True}):
        p = lower(QK, ScheduleConfig(dtype="f32", capacity=24, n_sms=9, **kw))
        q = assign(p, 9)
        check(p, q)
        vm = ReferenceVM(pack(p, q), w)
        for pos, tok in enumerate([5, 9, 2, 300]):
            out = vm.step({"token": tok, "pos": pos})
        outs.append(out["logits"])
    for kw, o in zip(("split", "fuse_rope=False", "unfused", "q_counter"), outs[1:]):
        torch.testing.assert_close(o, outs[0], rtol=1e-5, atol=1e-5, msg=lambda m: f"{kw}: {m}")


def test_adapters_on_q_k_v_take_narrow_embed_tasks():
    """Where the producers write the partial products (lora_a_tasks=False) and LoRA is on q, k or v, the
    EMBED tasks produce the first layer's, so they are about one per SM like the down tiles, not four of
    512 columns; other programs, and the default LORA_A tasks, keep 512."""
    def embeds(**kw):
        return [t for t in lower(PRESETS["llama-1b"], ScheduleConfig(n_sms=132, capacity=256, **kw)).tasks
                if t.label.startswith("embed")]
    assert len(embeds()) == 4
    assert len(embeds(lora_adapters=1, lora_rank=4, lora_targets=("o",))) == 4
    assert len(embeds(lora_adapters=1, lora_rank=4, lora_targets=("v",))) == 4
    assert len(embeds(lora_adapters=1, lora_rank=4, lora_targets=("v",), lora_a_tasks=False)) == 128


def test_lora_a_tasks_take_free_sms_before_their_projections():
    """llama-1b with rank-16 adapters on q, k, v, o: each layer's qkv group has 4 LORA_A tasks of 12 rows of
    A (48 KiB each) and the o group 2 of 8, emitted just before their projection tiles, so
    round robin puts none of them on an SM that runs a q/k/v tile of the same layer; no producer writes
    a partial product, and the projection tiles wait on the LORA_A tasks besides their input."""
    from megavm.schedule.assign import assign
    from megavm.schedule.validate import validate
    p = lower(PRESETS["llama-1b"], ScheduleConfig(n_sms=132, capacity=256, lora_adapters=1, lora_rank=16,
                                                  lora_targets=("q", "k", "v", "o")))
    assert validate(p).ok
    la = [t for t in p.tasks if t.opcode == Op.LORA_A]
    assert len(la) == 16 * (4 + 2)
    assert [(t.params["row0"], t.params["nrows"]) for t in la[:6]] == [(0, 12), (12, 12), (24, 12), (36, 12), (0, 8),
                                                                        (8, 8)]
    assert all(p.buffers[t.outputs[0]].shape == ((1, 48) if ".qkv" in t.label else (1, 16)) for t in la)
    assert all(w.polled for t in la for w in t.waits)        # each reads its whole input
    assert not any(t.params.get("lora_t") for t in p.tasks if t.opcode != Op.LORA_A)
    sm = {i: k for k, q in enumerate(assign(p, 132)) for i in q}
    for l in range(16):
        a_sms = {sm[i] for i, t in enumerate(p.tasks) if t.label.startswith(f"L{l}.lora_a.qkv")}
        qkv_sms = {sm[i] for i, t in enumerate(p.tasks) if t.label.startswith((f"L{l}.q[", f"L{l}.k[", f"L{l}.v["))}
        assert len(a_sms) == 4 and not a_sms & qkv_sms, l
    q0 = next(t for t in p.tasks if t.label == "L3.q[0]")
    assert [p.counters[w.counter].name for w in q0.waits] == ["x.3", "L3.lora_a.qkv"]


def test_a_group_whose_rows_do_not_fit_keeps_its_producers():
    """f32 with an FFN of 8200: one row of the down group's A and its input (2 x 32800 bytes) exceed a
    LORA_A task's shared memory, so the RMS_GLU tiles write that group's partial products (a row each)
    while the other groups take LORA_A tasks; the program validates and ReferenceVM's step matches one
    lowered with the producers everywhere."""
    from megavm.schedule.adapters import random_adapter
    from megavm.schedule.lora_layout import LoraLayout, lora_weights
    from megavm.schedule.validate import validate
    from megavm.schedule.weights import program_weights, random_hf_weights
    from megavm.vm.compile import compile
    from megavm.vm.reference import ReferenceVM
    cfg = ModelConfig(dim=72, n_layers=2, n_heads=6, n_kv_heads=2, head_dim=24, ffn_dim=8200, vocab=301)
    everything = ("q", "k", "v", "o", "gate", "up", "down")
    sc = ScheduleConfig(dtype="f32", capacity=32, n_sms=7, lora_adapters=1, lora_rank=4, lora_targets=everything)
    p = lower(cfg, sc)
    assert validate(p).ok
    groups = {t.label.split(".")[2].split("[")[0] for t in p.tasks if t.opcode == Op.LORA_A}
    assert groups == {"qkv", "o", "gu"}
    glu = [t for t in p.tasks if t.opcode == Op.RMS_GLU and t.label.startswith("L0.")]
    assert [t.params["lora_t"] for t in glu] == list(range(len(glu)))
    assert p.buffers[p.buffer_id("lora_u.down.0")].shape == (len(glu), 4)
    hf = random_hf_weights(cfg, torch.float32, seed=0)
    ad = random_adapter(cfg, 4, everything, 1, 1.0)
    logits = []
    for variant in (sc, ScheduleConfig(**{**sc.to_dict(), "lora_a_tasks": False})):
        w = program_weights(cfg, hf)
        w |= lora_weights(LoraLayout.of(cfg, variant), [ad], w)
        vm = ReferenceVM(compile(cfg, variant), w)
        for pos, tok in enumerate([5, 9, 2]):
            out = vm.step({"token": tok, "pos": pos, "adapter": 1})
        logits.append(out["logits"])
    torch.testing.assert_close(logits[0], logits[1], rtol=1e-5, atol=1e-5)


def test_lora_a_rows_sets_the_tasks_rows():
    """lora_a_rows picks the rows of A a LORA_A task takes (evened out over the group), and is refused below 0."""
    from megavm.core.errors import ConfigError
    from megavm.schedule.lora_layout import LoraLayout
    sc = ScheduleConfig(n_sms=132, capacity=256, lora_adapters=1, lora_rank=16, lora_targets=("q", "k", "v", "o"))
    assert LoraLayout.of(PRESETS["llama-1b"], sc).a_tiles("qkv") == [(0, 12), (12, 12), (24, 12), (36, 12)]
    seven = LoraLayout.of(PRESETS["llama-1b"], ScheduleConfig(**{**sc.to_dict(), "lora_a_rows": 7}))
    assert seven.a_tiles("qkv") == [(0, 7), (7, 7), (14, 7), (21, 7), (28, 7), (35, 7), (42, 6)]
    assert seven.a_tiles("o") == [(0, 6), (6, 6), (12, 4)]          # 3 tasks for 16 rows, evened out
    with pytest.raises(ConfigError, match="lora_a_rows=-1 must be >= 0"):
        LoraLayout.of(PRESETS["llama-1b"], ScheduleConfig(**{**sc.to_dict(), "lora_a_rows": -1}))
