"""The tuner's corpus and search, without a GPU: the corpus is a real SQLite file, the search runs
against a measure function whose times are a known function of the knobs."""
import json
import sqlite3

import pytest
import torch

from megavm import cli
from megavm.core.errors import UserError
from megavm.core.limits import MAX_KV_BLOCK, MAX_TILE_ROWS
from megavm.flywheel.corpus import Config, Corpus, Row, shape_key, shape_of
from megavm.flywheel.prior import tuned
from megavm.flywheel.tune import Measurement, Progress, knob_values, search
from megavm.schedule.config import ScheduleConfig, resolve
from dataclasses import replace
from megavm.schedule.models import PRESETS

GPU = "NVIDIA H100 80GB HBM3"
LLAMA = shape_of(PRESETS["llama-1b"], "bf16")


def row(ms, verdict="PASS", ctx=128, knobs=None, shape=LLAMA, gpu=GPU, commit="abc1234", model="llama-1b"):
    return Row(model=model, shape=shape, gpu=gpu, ctx=ctx, knobs=knobs or {"schedule": {}, "build": {}},
               kernel_ms=ms, verdict=verdict, rel_err=1e-3, commit=commit, date="2026-11-23")


def test_corpus_keeps_every_row_once_and_finds_the_best(tmp_path):
    with Corpus(tmp_path / "c.sqlite") as c:
        assert c.add(row(1.10)) and not c.add(row(1.10)), "the same measurement twice is one row"
        c.add(row(1.05, knobs={"schedule": {"o_rows": 32}, "build": {}}))
        c.add(row(0.90, verdict="FAIL", knobs={"schedule": {"o_rows": 8}, "build": {}}))     # fast but wrong
        c.add(row(None, verdict="ERROR", knobs={"schedule": {"kv_block": 16}, "build": {}}))
        c.add(row(1.00, ctx=4096, knobs={"schedule": {"kv_block": 512}, "build": {}}))
        c.add(row(0.50, gpu="NVIDIA H200"))
        assert len(c.rows()) == 6 and len(c.rows(shape=LLAMA, gpu=GPU, ctx=128)) == 4
        best = c.best(LLAMA, GPU, 200)
        assert (best.kernel_ms, best.knobs["schedule"]) == (1.05, {"o_rows": 32})
        assert c.best(LLAMA, GPU, 3000).ctx == 4096, "the nearest context measured"
        assert c.best(shape_of(PRESETS["small"], "bf16"), GPU, 128) is None
        assert c.best(LLAMA, "NVIDIA A100", 128) is None


def test_corpus_exports_and_appends_from_other_machines(tmp_path):
    with Corpus(tmp_path / "a.sqlite") as a:
        a.add(row(1.10))
        a.add(row(0.95, gpu="NVIDIA H200"))
        assert a.export_json(tmp_path / "a.json") == 2
    doc = json.loads((tmp_path / "a.json").read_text())
    assert doc["kind"] == "megavm-corpus" and {r["gpu"] for r in doc["rows"]} == {GPU, "NVIDIA H200"}
    with Corpus(tmp_path / "b.sqlite") as b:
        b.add(row(1.20, commit="def5678"))
        assert b.import_json(tmp_path / "a.json") == 2 and b.import_json(tmp_path / "a.json") == 0
        assert sorted(r.kernel_ms for r in b.rows()) == [0.95, 1.10, 1.20]
        assert b.best(LLAMA, "NVIDIA H200", 128).kernel_ms == 0.95
    (tmp_path / "bad.json").write_text('{"kind": "bench"}')
    with Corpus(tmp_path / "b.sqlite") as b, pytest.raises(UserError, match="not an exported megavm corpus"):
        b.import_json(tmp_path / "bad.json")
    (tmp_path / "junk.sqlite").write_text("not a database, long enough to have a header line" * 20)
    with pytest.raises(UserError, match="not a megavm corpus"):
        Corpus(tmp_path / "junk.sqlite")


def test_shape_key_is_the_config_and_dtype():
    assert shape_key(LLAMA) == shape_key(json.loads(json.dumps(LLAMA)))
    assert shape_key(LLAMA) != shape_key(shape_of(PRESETS["llama-1b"], "f32"))
    assert shape_key(LLAMA) != shape_key(shape_of(PRESETS["llama-7b-32k"], "bf16"))


def test_knob_values_stay_within_what_the_kernel_takes():
    for name in ("llama-1b", "small", "qwen3-1.7b", "gemma-2b"):
        cfg = PRESETS[name]
        lc = resolve(cfg, ScheduleConfig(capacity=144, n_sms=132))
        knobs = {n: v for _, n, v in knob_values(cfg, lc)}
        for n in ("o_rows", "down_rows", "lm_rows"):
            assert all(2 <= v <= MAX_TILE_ROWS and v % 2 == 0 and v != getattr(lc, n) for v in knobs[n]), (name, n)
        assert all(2 <= v <= MAX_TILE_ROWS // 2 for v in knobs["ffn_rows"])
        assert all(cfg.head_dim % v == 0 and v % 2 == 0 for v in knobs["qkv_rows"])
        assert all(16 <= v <= MAX_KV_BLOCK and v % 16 == 0 for v in knobs.get("kv_block", []))
        assert ("split_head_norm" in knobs) == cfg.qk_norm, name
        assert all(1 <= v <= cfg.group * cfg.head_dim // 2 and v != lc.q_tiles for v in knobs["q_tiles"]), name
        assert all(1 <= v <= cfg.head_dim // 2 and v != lc.kv_tiles for v in knobs["kv_tiles"]), name
        assert lc.kv_tiles - 1 in knobs["kv_tiles"] or lc.kv_tiles == 1, name
        # one KV block a head by default at capacity 144 on all four (within ONE_BLOCK_WORK): then no partial
        # is crowded, and attn_direct=False is the knob that brings the blocks (and the crowding of
        # qwen3-1.7b and of llama-1b's 8 q tiles a KV head) back
        assert "fit_chain" not in knobs and lc.kv_block >= 144 and knobs["attn_direct"] == [False], name
        blocks = resolve(cfg, ScheduleConfig(capacity=144, n_sms=132, attn_direct=False))
        assert ("fit_chain" in {n for _, n, v in knob_values(cfg, blocks) if v}) == (name in ("qwen3-1.7b", "llama-1b")), name
        for n, vs in knobs.items():          # every value lowers (the search only ever meets valid programs)
            kind = "build" if n.startswith("MVM_") else "schedule"
            if kind == "schedule":
                for v in vs:             # and is honoured
                    got = resolve(cfg, ScheduleConfig(capacity=144, n_sms=132, **{n: v}))
                    assert n == "cost" or getattr(got, n) == v, (name, n, v)


def test_knob_values_try_the_4bit_tensor_core_paths_on_their_formats():
    """NVFP4 programs try MVM_E2M1_F8 off and on every tile; int4 ones MVM_U4_IMMA (32 by default) on tiles of
    96 rows or more and on every tile, and MVM_U4_IMMA_LONG (32 by default) off and on every tile; others none
    of them"""
    cfg = PRESETS["llama-1b"]
    names = ("MVM_E2M1_F8", "MVM_U4_IMMA", "MVM_U4_IMMA_LONG")
    for weights, want in (("nvfp4", {"MVM_E2M1_F8": [0, 1]}),
                          ("int4", {"MVM_U4_IMMA": [96, 1], "MVM_U4_IMMA_LONG": [0, 1]}), ("", {}), ("fp8", {})):
        lc = resolve(cfg, ScheduleConfig(capacity=144, n_sms=132, weights=weights))
        knobs = {n: v for _, n, v in knob_values(cfg, lc) if n in names}
        assert knobs == want, weights


def _fake(times: dict, fail=()):
    """measure(): 1 ms less each knob value's saving; values in `fail` FAIL (and are faster)."""
    calls = []

    def measure(c: Config) -> Measurement:
        calls.append(c)
        knobs = dict(c.schedule + c.build)
        if any((k, v) in fail for k, v in knobs.items()):
            return Measurement(c, 0.1, "FAIL", 0.5)
        if knobs.get("kv_block") == 32 or knobs.get("attn_direct") is False:
            return Measurement(c, None, "ERROR", detail="ValueError: does not lower")
        return Measurement(c, 1.0 - sum(times.get((k, v), 0.0) for k, v in knobs.items()), "PASS", 1e-3)
    return measure, calls


class _Quiet(Progress):
    def __init__(self, budget_s):
        super().__init__(budget_s, stream=open("/dev/null", "w"))


def test_search_keeps_what_passes_and_is_faster():
    cfg = PRESETS["small"]
    base = ScheduleConfig(capacity=144, n_sms=132)
    lc = resolve(cfg, base)
    o_vals = dict((n, v) for _, n, v in knob_values(cfg, lc))["o_rows"]
    saving = {("o_rows", o_vals[0]): 0.10, ("strategy", "balanced"): 0.001, ("MVM_INFLIGHT", 3): 0.05}
    measure, calls = _fake(saving, fail={("fuse_combine", True)})
    recorded = []
    best, seen = search(cfg, base, measure, 1e6, recorded.append, _Quiet(1e6))
    assert best.config.knobs() == {"schedule": {"o_rows": o_vals[0]}, "build": {"MVM_INFLIGHT": 3}}
    assert best.kernel_ms == pytest.approx(0.85)
    assert "balanced" not in best.config.describe(), "a saving under the noise is not kept"
    assert all(m.config != best.config or m.verdict == "PASS" for m in seen)
    assert len(recorded) == len(seen) == len(set(calls)), "every configuration measured once, each recorded"
    assert any(m.verdict == "FAIL" for m in seen) and any(m.verdict == "ERROR" for m in seen)
    assert seen[0].config == Config() and seen[0].verdict == "PASS"


def test_search_stops_at_its_budget_and_refuses_a_failing_default():
    cfg = PRESETS["small"]
    base = ScheduleConfig(capacity=144, n_sms=132)
    measure, _ = _fake({})
    best, seen = search(cfg, base, measure, 0.0, progress=_Quiet(0.0))
    assert [m.config for m in seen] == [Config()], "no time left: the defaults only"

    def failing(c):
        return Measurement(c, 1.0, "FAIL", 0.3)
    with pytest.raises(UserError, match="the default configuration does not pass"):
        search(cfg, base, failing, 10.0, progress=_Quiet(10.0))


def test_run_and_bench_take_the_corpus_best(tmp_path):
    cfg = PRESETS["qwen3-1.7b"]
    sc = ScheduleConfig(capacity=200, n_sms=132)
    with Corpus(tmp_path / "c.sqlite") as c:
        got, defines, note = tuned(cfg, "bf16", sc, GPU, 128, c)
        assert (got, defines) == (sc, {}) and note.startswith("schedule: defaults (no tuned configuration")
        c.add(row(1.80, shape=shape_of(cfg, "bf16"),
                  knobs={"schedule": {"o_rows": 32, "split_head_norm": False}, "build": {"MVM_STAGES": 8}}))
        got, defines, note = tuned(cfg, "bf16", sc, GPU, 150, c)
        assert got.o_rows == 32 and not got.split_head_norm and got.capacity == 200 and defines == {"MVM_STAGES": 8}
        assert note.startswith("schedule: tuned on this GPU (o_rows=32, split_head_norm=False, MVM_STAGES=8; 1.800 ms")
        assert tuned(cfg, "f32", sc, GPU, 128, c)[0] == sc, "a bf16 tuning is not an f32 one"
        c.add(row(1.70, shape=shape_of(cfg, "bf16"), knobs={"schedule": {"ring_magic": 3}, "build": {}}))
        got, _, note = tuned(cfg, "bf16", sc, GPU, 128, c)
        assert got == sc and "['ring_magic'] are not this megavm's" in note


def test_tune_command_refuses_cleanly(capsys):
    assert cli.main(["tune"]) == 2
    assert "name a model: --model NAME or --checkpoint DIR" in capsys.readouterr().err
    if not torch.cuda.is_available():
        assert cli.main(["tune", "--model", "small"]) == 2
        err = capsys.readouterr().err
        assert err.startswith("megavm tune: error: needs an NVIDIA GPU") and len(err.strip().splitlines()) == 1
    assert cli.main(["tune", "--model", "small", "--budget", "0"]) == 2
    assert "--budget" in capsys.readouterr().err


def test_corpus_file_is_plain_sqlite(tmp_path):
    with Corpus(tmp_path / "c.sqlite") as c:
        c.add(row(1.0))
    with sqlite3.connect(tmp_path / "c.sqlite") as db:
        assert db.execute("SELECT kernel_ms, verdict, commit_id FROM runs").fetchall() == [(1.0, "PASS", "abc1234")]


def test_corpus_best_is_by_median_and_stays_with_the_defaults_within_the_noise(tmp_path):
    A = {"schedule": {"o_rows": 32}, "build": {}}
    B = {"schedule": {"kv_block": 32, "lm_rows": 128}, "build": {}}
    with Corpus(tmp_path / "c.sqlite") as c:
        for ms in (1.00, 1.02, 1.01):
            c.add(row(ms))
        c.add(row(1.006, knobs=A))                         # faster than the defaults' median by 0.4%: noise
        assert c.best(LLAMA, GPU, 128).knobs == {"schedule": {}, "build": {}}
        for ms in (0.98, 1.05, 0.99):                      # one lucky 0.98 and one slow run: the median 0.99
            c.add(row(ms, knobs=B))
        best = c.best(LLAMA, GPU, 128)
        assert best.knobs == B and best.kernel_ms == 0.99


def test_prior_carries_relative_knobs_to_the_nearest_untuned_shape(tmp_path):
    from megavm.flywheel.prior import apply, prior, relative
    llama, small, qwen3 = (shape_of(PRESETS[m], "bf16") for m in ("llama-1b", "small", "qwen3-1.7b"))
    d_llama = resolve(PRESETS["llama-1b"], ScheduleConfig(capacity=144, n_sms=132))
    d_small = resolve(PRESETS["small"], ScheduleConfig(capacity=144, n_sms=132))
    knobs = {"schedule": {"o_rows": 2 * d_llama.o_rows, "kv_block": d_llama.kv_block // 2, "strategy": "balanced",
                          "qkv_rows": 32}, "build": {"MVM_INFLIGHT": 3}}
    src = row(1.0, knobs=knobs, shape=llama)
    rel = relative(src, 132)
    assert rel["o_rows"] == ("ratio", 2.0) and rel["strategy"] == ("value", "balanced")
    got = apply(rel, small, 128, 132, {"MVM_INFLIGHT": 3}).knobs()
    assert got["build"] == {"MVM_INFLIGHT": 3} and got["schedule"]["strategy"] == "balanced"
    assert got["schedule"]["o_rows"] == min(MAX_TILE_ROWS, 2 * d_small.o_rows)
    assert got["schedule"].get("kv_block", d_small.kv_block) == max(16, 16 * round(d_small.kv_block / 2 / 16))
    assert PRESETS["small"].head_dim % got["schedule"]["qkv_rows"] == 0
    with Corpus(tmp_path / "c.sqlite") as c:
        assert prior(small, 128, GPU, c, 132) is None
        c.add(src)
        c.add(row(2.0, shape=qwen3, knobs={"schedule": {"split_head_norm": False}, "build": {}}, model="qwen3-1.7b"))
        pick = prior(small, 128, GPU, c, 132)
        assert pick.source.shape == llama, "llama-1b is nearer small than qwen3-1.7b is"
        assert pick.config == Config(), "two neighbours that disagree on every knob: no majority, the defaults"
        gemma = shape_of(PRESETS["gemma-2b"], "bf16")
        c.add(row(2.5, shape=gemma, knobs={"schedule": {"strategy": "balanced"}, "build": {"MVM_INFLIGHT": 3}},
                  model="gemma-2b"))
        pick = prior(small, 128, GPU, c, 132)
        assert pick.config.knobs() == {"schedule": {"strategy": "balanced"}, "build": {"MVM_INFLIGHT": 3}}, \
            "what two of three neighbours share, and only that"
        assert pick.voters == ("llama-1b", "qwen3-1.7b", "gemma-2b"), "the neighbours, nearest first"
        # qwen3's head-norm switch never carries to a model without head norms
        assert "split_head_norm" not in pick.config.knobs()["schedule"]
        sc, defines, note = tuned(PRESETS["small"], "bf16", ScheduleConfig(capacity=144, n_sms=132), GPU, 128, c)
        assert sc.strategy == "balanced" and defines == {"MVM_INFLIGHT": 3}
        assert note.startswith("schedule: the prior's (") and "this shape is not tuned on this GPU" in note
        c.add(row(0.5, shape=small, knobs={"schedule": {"ring_magic": 1}, "build": {}}, model="old"))
        assert prior(small, 128, GPU, c, 132).voters == pick.voters, \
            "another version's knobs do not vote, even on the very shape"


def test_vote_needs_a_majority_and_averages_close_ratios():
    from megavm.flywheel.prior import vote
    rels = [{"o_rows": ("ratio", 2.0), "strategy": ("value", "round_robin")},
            {"o_rows": ("ratio", 1.8)},
            {"o_rows": ("ratio", 0.5), "strategy": ("value", "balanced")}]
    got = vote(rels, quorum=2)
    assert set(got) == {"o_rows"} and got["o_rows"][0] == "ratio"
    assert got["o_rows"][1] == pytest.approx((2.0 * 1.8) ** 0.5)
    assert vote(rels, quorum=3) == {}


def test_cost_model_fitted_on_a_timeline_recovers_the_rates_and_the_hand_off():
    """A synthetic launch where every opcode's task takes overhead + bytes / rate after its wait, and
    each waiter starts 1500 ns after its last counter completes: the fit returns those numbers, and
    the balanced assignment under them gives a valid program."""
    import numpy as np

    from megavm.flywheel.costfit import fit
    from megavm.instructions import Op
    from megavm.schedule.assign import CostModel
    from megavm.schedule.lower import lower
    from megavm.schedule.plan import plan
    from megavm.vm.compile import compile
    cfg = PRESETS["small"]
    sc = ScheduleConfig(capacity=144, n_sms=132)
    program = lower(cfg, sc)
    rate = {int(op): (300.0 + 100 * i, 5.0 + i) for i, op in enumerate(Op)}
    end = {}
    tl = np.zeros((len(program.tasks), 4), dtype=np.int64)
    for i, t in enumerate(program.tasks):              # program order is a topological order
        ready = max((end[w.counter] for w in t.waits), default=0)
        t0 = max(0, ready - 1000)                      # already waiting when it becomes ready
        t1 = ready + 1500 if t.waits else t0
        a, bpn = rate[t.opcode]
        tl[i] = (t0, t1, t1 + int(round(a + t.est_bytes / bpn)), 0)
        if t.signal >= 0:
            end[t.signal] = max(end.get(t.signal, 0), int(tl[i, 2]))
    table = fit(program, tl)
    got = {n: (a, b) for n, a, b in table}
    assert got["handoff"][0] == pytest.approx(1500, abs=1)
    run = tl[:, 2] - tl[:, 1]
    for i, t in enumerate(program.tasks):           # each task's time as fitted (one size: no rate to see)
        if Op(t.opcode).name not in got:
            assert sum(u.opcode == t.opcode for u in program.tasks) < 4, "only rare opcodes keep the defaults"
            continue
        a, bpn = got[Op(t.opcode).name]
        assert a + t.est_bytes / bpn == pytest.approx(run[i], abs=2), program.describe_task(i)
    a, bpn = rate[int(Op.RMS_LINEAR_ARGMAX)]         # tiles of two sizes: the rate itself
    assert got["RMS_LINEAR_ARGMAX"] == (pytest.approx(a, abs=2), pytest.approx(bpn, rel=1e-3))
    cost = CostModel.of(table)
    assert cost.handoff_ns == got["handoff"][0] and cost.task_ns(1000, 0, int(Op.RMS_GLU)) > 0
    fitted = replace(sc, cost=table)
    assert plan(cfg, fitted).report.ok
    compile(cfg, fitted)
    balanced = replace(sc, strategy="balanced")
    assert knob_values(cfg, resolve(cfg, balanced), table)[-1] == ("schedule", "cost", [table])
    assert all(n != "cost" for _, n, _ in knob_values(cfg, resolve(cfg, sc), table)), "round robin reads no costs"
    c = Config.of({"cost": json.loads(json.dumps(table))}, {})       # as the corpus gives it back
    assert c.describe() == f"cost=fitted({len(table)} rows)" and hash(c)


def test_tile_counts_carry_as_ratios_and_only_where_honoured():
    """kv_tiles travels like q_tiles: llama-1b's 2 (its default 3) becomes 2/3 of small's 5; a Qwen3
    step without the split head norm has whole-head tiles, so neither count is searched there."""
    from megavm.flywheel.prior import apply, relative
    llama, small = (shape_of(PRESETS[m], "bf16") for m in ("llama-1b", "small"))
    d_llama = resolve(PRESETS["llama-1b"], ScheduleConfig(capacity=144, n_sms=132))
    d_small = resolve(PRESETS["small"], ScheduleConfig(capacity=144, n_sms=132))
    rel = relative(row(1.0, knobs={"schedule": {"kv_tiles": 2}, "build": {}}, shape=llama), 132)
    assert rel["kv_tiles"] == ("ratio", 2 / d_llama.kv_tiles)
    got = apply(rel, small, 128, 132, {}).knobs()["schedule"]
    assert got.get("kv_tiles", d_small.kv_tiles) == round(d_small.kv_tiles * 2 / d_llama.kv_tiles)
    cfg = PRESETS["qwen3-1.7b"]
    lc = resolve(cfg, ScheduleConfig(capacity=144, n_sms=132, split_head_norm=False))
    knobs = {n for _, n, _ in knob_values(cfg, lc)}
    assert not knobs & {"q_tiles", "kv_tiles"}, knobs
