"""The pieces of `megavm bench` and `megavm trace` that run without a GPU."""
import json
import math

import numpy as np
import pytest
import torch

from megavm.flywheel.bench import bytes_read
from megavm.flywheel.peers import TorchDecoder
from megavm.flywheel.trace import chrome_trace, stage_name, summarize
from megavm.schedule.assign import assign
from megavm.schedule.config import ScheduleConfig
from megavm.schedule.eager import EagerDecoder
from megavm.schedule.lower import lower
from megavm.schedule.models import PRESETS
from megavm.schedule.weights import random_hf_weights
from megavm.vm.pack import pack
from tests.hf_families import CASES, PROMPT, save


def test_peer_decoder_matches_eager_tokens():
    """The bench's peer must compute the same model: f32 weights, same greedy tokens as the oracle."""
    cfg = PRESETS["tiny"]
    hf = random_hf_weights(cfg, torch.float32, seed=2)
    peer, eager = TorchDecoder(cfg, hf, 32), EagerDecoder(cfg, hf, 32)
    tok = 4
    for pos in range(12):
        peer.set(tok, pos)
        got = int(peer.step()[0])
        want = int(eager.step(tok, pos).argmax())
        assert got == want, f"{pos=} {got=} {want=}"
        tok = got


@pytest.mark.parametrize("fmt", ["fp8", "nvfp4", "int4", "fp8-block"])
def test_quantized_peer_decoder_dequantizes_on_the_fly(fmt):
    """The fp8 (nvfp4, int4, fp8-block) peer keeps e4m3 codes and row scales (e2m1 codes, block and row
    scales; int4 codes, group scales and zero points; e4m3 codes and block scales) and computes the
    model they stand for: greedy tokens of the eager model of the dequantized weights, logits within
    1e-5 of max |logit| (f32 activations); the unquantized model is farther away."""
    from megavm.schedule.models import ModelConfig
    from megavm.schedule.weights import quantized_model
    cfg = PRESETS["tiny"] if fmt in ("fp8", "nvfp4") else ModelConfig(
        dim=128, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=32, ffn_dim=256, vocab=256, tied_embeddings=True)
    hf = random_hf_weights(cfg, torch.float32, seed=2)
    qcfg, deq = quantized_model(cfg, hf, fmt)
    peer, eager, plain = TorchDecoder(qcfg, deq, 32, weights=fmt), EagerDecoder(qcfg, deq, 32), EagerDecoder(cfg, hf, 32)
    code = torch.float8_e4m3fn if fmt.startswith("fp8") else torch.uint8
    assert peer.l0_wqkv.dtype == code and peer.head.dtype == code
    tok, far = 4, 0.0
    for pos in range(12):
        got = peer.logits(torch.tensor([tok]), torch.tensor([pos]))[0]
        want = eager.step(tok, pos)
        scale = want.abs().max().item()
        assert (got - want).abs().max().item() <= 1e-5 * scale, f"{pos=}"
        far = max(far, (plain.step(tok, pos) - want).abs().max().item() / scale)
        assert int(got.argmax()) == int(want.argmax())
        tok = int(want.argmax())
    assert far > 1e-3, f"the unquantized model is within {far:.1e}: the check cannot tell the two apart"
    with pytest.raises(ValueError, match="bf16, fp8, fp8-block, nvfp4, int4"):
        TorchDecoder(cfg, hf, 32, weights="mxfp4")


def test_peer_with_an_fp8_cache_decodes_as_the_eager_model_of_that_cache():
    """The peer's fp8 KV cache (e4m3 codes, a scale per position over every KV head) gives the eager
    model's fp8-cache logits within 1e-5 of max |logit| (f32) and its greedy tokens; the bf16-cache
    model is farther away, so the check tells the two apart."""
    cfg = PRESETS["tiny"]
    hf = random_hf_weights(cfg, torch.float32, seed=3)
    peer, eager = TorchDecoder(cfg, hf, 32, kv_cache="fp8"), EagerDecoder(cfg, hf, 32, kv_cache="fp8")
    plain = EagerDecoder(cfg, hf, 32)
    assert peer.l0_k.dtype == torch.uint8 and peer.l0_ks.shape == (1, 1, 32, 1)      # e4m3 codes' bytes
    tok, far = 4, 0.0
    for pos in range(12):
        got, want = peer.logits(torch.tensor([tok]), torch.tensor([pos]))[0], eager.step(tok, pos)
        scale = want.abs().max().item()
        assert (got - want).abs().max().item() <= 1e-5 * scale, f"{pos=}"
        assert int(got.argmax()) == int(want.argmax())
        far = max(far, (plain.step(tok, pos) - want).abs().max().item() / scale)
        tok = int(want.argmax())
    assert far > 1e-4, f"the bf16-cache model is within {far:.1e}: the check cannot tell the two apart"
    with pytest.raises(ValueError, match="KV cache is '' .* or 'nvfp4', not 'int8'"):
        TorchDecoder(cfg, hf, 32, kv_cache="int8")


@pytest.mark.parametrize("kv_heads,window", [(2, None), (1, 4)])
def test_peer_with_an_nvfp4_cache_decodes_as_the_eager_model_of_that_cache(kv_heads, window):
    """The peer's NVFP4 KV cache (e2m1 code bytes, e4m3 block scales, a scale per position, from KV_QUANT's
    quantizer; keys' blocks of 16 in megavm's RoPE pair order, arranged by the peer itself) gives the eager model's nvfp4-cache logits within 1e-5 of
    max |logit| (f32) and its greedy tokens (GQA; MQA with a sliding window); the bf16- and fp8-cache
    models are 1e-3 or more away, so the check tells them apart."""
    from megavm.schedule.models import ModelConfig
    cfg = ModelConfig(dim=128, n_layers=2, n_heads=4, n_kv_heads=kv_heads, head_dim=64, ffn_dim=96, vocab=200,
                      sliding_window=window)
    hf = random_hf_weights(cfg, torch.float32, seed=3)
    peer, eager = TorchDecoder(cfg, hf, 16, kv_cache="nvfp4"), EagerDecoder(cfg, hf, 16, kv_cache="nvfp4")
    others = [EagerDecoder(cfg, hf, 16), EagerDecoder(cfg, hf, 16, kv_cache="fp8")]
    assert (peer.l0_k.dtype, peer.l0_k.shape, peer.l0_kb.shape, peer.l0_ks.shape) == (
        torch.uint8, (1, kv_heads, 16, 32), (1, kv_heads, 16, 4), (1, 1, 16, 1))
    from megavm.core.codecs import nvfp4_rows
    y = torch.randn(64 * kv_heads, generator=torch.Generator().manual_seed(0))
    codes, bs, s = peer._nvfp4(y.view(1, kv_heads, 1, 64), keys=False)     # KV_QUANT's quantizer (core/codecs.py),
    want = nvfp4_rows(y.view(kv_heads, 64), y.abs().max())                    # stored in the peer's layout
    assert torch.equal(codes.view(kv_heads, 32), want[0]) and torch.equal(bs.view(kv_heads, 4), want[1].view(torch.uint8))
    assert s.shape == (1, 1, 1, 1) and s.item() == want[2].item()
    tok, far = 4, [0.0, 0.0]
    for pos in range(10):
        got, want = peer.logits(torch.tensor([tok]), torch.tensor([pos]))[0], eager.step(tok, pos)
        scale = want.abs().max().item()
        assert (got - want).abs().max().item() <= 1e-5 * scale, f"{pos=}"
        assert int(got.argmax()) == int(want.argmax())
        far = [max(f, (m.step(tok, pos) - want).abs().max().item() / scale) for f, m in zip(far, others)]
        tok = int(want.argmax())
    assert min(far) >= 1e-3, f"the bf16- and fp8-cache models are within {far}: the check cannot tell them apart"


@pytest.mark.parametrize("kv_cache", ["fp8", "nvfp4"])
def test_fill_history_is_one_history_for_megavm_and_the_oracle(kv_cache):
    """fill_history's quantized history (on the CPU here) in ReferenceVM's caches and the eager model's
    store: decoding on from ctx, logits within 1e-5 of max |logit| and the same tokens (keys interleaved,
    blocks of 16 in cache order, rows swizzled where the cache is)."""
    from megavm.flywheel.bench import fill_history
    from megavm.schedule.models import ModelConfig
    from megavm.schedule.weights import program_weights
    from megavm.vm.reference import ReferenceVM
    cfg = ModelConfig(dim=128, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=64, ffn_dim=96, vocab=200)
    hf, ctx = random_hf_weights(cfg, torch.float32, seed=4), 12
    p = lower(cfg, ScheduleConfig(dtype="f32", capacity=16, n_sms=4, kv_cache=kv_cache))
    vm = ReferenceVM(pack(p, assign(p, 4)), program_weights(cfg, hf))
    eager = EagerDecoder(cfg, hf, 16, kv_cache=kv_cache)
    fill_history(cfg, ctx, eager, [vm.buffer], kv_cache=kv_cache, device="cpu")
    assert vm.buffer("k_scale.1")[:, :ctx].gt(0).all() and eager.k[1, :, :ctx].abs().gt(0).any()
    tok = 3
    for pos in range(ctx, 16):
        out, want = vm.step({"token": tok, "pos": pos}), eager.step(tok, pos)
        assert ((out["logits"] - want).abs().max() / want.abs().max()).item() <= 1e-5, pos
        assert int(out["next_token"][0]) == int(want.argmax())
        tok = int(want.argmax())


@pytest.mark.parametrize("name", sorted(CASES))
def test_peer_decoder_matches_transformers(name, tmp_path):
    """The bench's peer computes each family's step as transformers' model class does (f32 weights):
    logits within 1e-5 of each position's max |logit| over a prompt longer than a window of 8."""
    pytest.importorskip("transformers")
    from megavm.schedule.checkpoint import load
    m = save(name, tmp_path)
    ck = load(tmp_path)
    peer = TorchDecoder(ck.cfg, ck.hf, 32)
    with torch.no_grad():
        want = m(input_ids=torch.tensor([PROMPT])).logits[0]
        for pos, tok in enumerate(PROMPT):
            got = peer.logits(torch.tensor([tok]), torch.tensor([pos]))[0]
            err = (got - want[pos]).abs().max().item() / want[pos].abs().max().item()
            assert err <= 1e-5, f"{name} {pos=}: {err:.2e}"


def test_bytes_read_llama1b():
    """Llama-3.2-1B at context 128: about 2.47 GB a step (one embedding row, tied LM head, KV to pos)."""
    gb = bytes_read(PRESETS["llama-1b"], 128) / 1e9
    assert math.isclose(gb, 2.47, rel_tol=0.01), f"{gb=}"


def test_chrome_trace_and_summary_on_a_synthetic_timeline():
    prog = lower(PRESETS["tiny"], ScheduleConfig(capacity=32, n_sms=4))
    packed = pack(prog, assign(prog, 4))
    n = len(prog.tasks)
    start = np.arange(n, dtype=np.int64) * 1000
    tl = np.stack([start, start + 100, start + 600, np.arange(n) % 4], axis=1)
    tr = chrome_trace(tl, packed)
    runs = [e for e in tr["traceEvents"] if e["cat"] != "wait"]
    waits = [e for e in tr["traceEvents"] if e["cat"] == "wait"]
    assert len(runs) == n and len(waits) == n
    assert runs[3]["name"] == prog.tasks[3].label and runs[3]["dur"] == pytest.approx(0.5)
    json.dumps(tr)
    s = summarize(tl, packed)
    assert s["blocks"] == 4 and sum(o["tasks"] for o in s["ops"].values()) == n
    assert all(o["wait_us"] == pytest.approx(0.1) and o["run_us"] == pytest.approx(0.5) for o in s["ops"].values())


def test_stages_follow_the_counters():
    """On a synthetic timeline where task i runs [1000 i + 100, 1000 i + 600): each counter's stage time
    is its last producer's end minus the latest readiness of the counters that producer waits on."""
    prog = lower(PRESETS["tiny"], ScheduleConfig(capacity=32, n_sms=4))
    packed = pack(prog, assign(prog, 4))
    n = len(prog.tasks)
    start = np.arange(n, dtype=np.int64) * 1000
    tl = np.stack([start, start + 100, start + 600, np.arange(n) % 4], axis=1)
    st = summarize(tl, packed)["stages"]
    assert stage_name("L3.qkv.h2") == "qkv" and stage_name("x.4") == "x" and stage_name("xn.4.norm") == "xn.norm"
    ready, ends = {}, {}
    for i, t in enumerate(prog.tasks):
        ready[t.signal] = max(ready.get(t.signal, 0), tl[i, 2])
        ends.setdefault(t.signal, []).append(tl[i, 2])
    want, tails, sm_tails = {}, {}, {}
    for c, r in ready.items():
        waits = [ready[w.counter] for i, t in enumerate(prog.tasks) if t.signal == c for w in t.waits]
        want.setdefault(stage_name(prog.counters[c].name), []).append((r - max(waits, default=0)) / 1e3)
        e = sorted(ends[c])                      # the last producer's end after the median one's
        med = e[len(e) // 2] if len(e) % 2 else (e[len(e) // 2 - 1] + e[len(e) // 2]) / 2
        tails.setdefault(stage_name(prog.counters[c].name), []).append((e[-1] - med) / 1e3)
        last = {}                                # and after the median SM's last one
        for i, t in enumerate(prog.tasks):
            if t.signal == c:
                last[int(tl[i, 3])] = max(last.get(int(tl[i, 3]), 0), int(tl[i, 2]))
        sm_tails.setdefault(stage_name(prog.counters[c].name), []).append((e[-1] - np.median(list(last.values()))) / 1e3)
    assert set(st) == set(want)
    for k, v in want.items():
        assert st[k]["count"] == len(v) and st[k]["mean_us"] == pytest.approx(np.mean(v)), k
        assert st[k]["max_us"] == pytest.approx(max(v)), k
        assert st[k]["tail_us"] == pytest.approx(np.mean(tails[k])), k
        assert st[k]["sm_tail_us"] == pytest.approx(np.mean(sm_tails[k])), k
    assert any(o["tail_us"] > 0 for o in st.values()), "a stage of several producers ends after its median"
    assert any(o["sm_tail_us"] < o["tail_us"] for o in st.values()), "SMs with several producers of a counter"


def test_dlrm_bench_pieces():
    """The DLRM bench's floor bytes, its table and its results schema, without a GPU."""
    from megavm.flywheel import bench_dlrm, results
    from megavm.schedule.dlrm import PRESETS as DLRM
    cfg = DLRM["dlrm-kaggle"]
    mlp = (13 * 512 + 512 * 256 + 256 * 64 + 64 * 16) + (367 * 512 + 512 * 256 + 256) + (512 + 256 + 64 + 16 + 512 + 256 + 1)
    assert bench_dlrm.bytes_read(cfg, 128) == 2 * mlp + 2 * 128 * 26 * 16 + 4 * 128 * (13 + 26)
    row = {"model": "dlrm-kaggle", "batch": 128, "GB": 1e-3, "floor_ms": 3e-4, "tasks": 1120, "verdict": "PASS",
           "max_abs_err": 1e-7, "megavm_ms": 0.02, "megavm_run_ms": 0.05, "eager_ms": 0.3, "cudagraph_ms": 0.05}
    text = bench_dlrm.table([row])
    assert "megavm kernel" in text and "graph x2.50" in text and "PASS" in text
    doc = {"kind": "bench_dlrm", "schema": results.SCHEMA_VERSION, "device": "NVIDIA H100 80GB HBM3",
           "date": "2026-11-23", "commit": "abc1234", "command": "megavm bench --model dlrm-kaggle", "note": "t",
           "copy_GBps": 3000.0, "rows": [row]}
    assert results.validate(doc) == []
    assert results.headline(doc) == "dlrm-kaggle batch 128 0.0200 ms PASS"
    assert any("max_abs_err" in p for p in results.validate({**doc, "rows": [{**row, "max_abs_err": "x"}]}))


def test_bytes_read_of_a_quantized_kv_cache():
    """Per K or V row (KV head, position up to the new one): bf16 2 bytes an element; fp8 one byte an
    element and an f32 scale; nvfp4 half a byte an element, an e4m3 scale per 16 and an f32 scale."""
    cfg, ctx = PRESETS["llama-1b"], 127
    rows = 2 * cfg.n_layers * cfg.n_kv_heads * (ctx + 1)
    bf16 = bytes_read(cfg, ctx)
    assert bf16 - bytes_read(cfg, ctx, kv_cache="fp8") == rows * (2 * 64 - (64 + 4))
    assert bf16 - bytes_read(cfg, ctx, kv_cache="nvfp4") == rows * (2 * 64 - (32 + 4 + 4))
    assert bytes_read(cfg, ctx, "nvfp4", "nvfp4") - bytes_read(cfg, ctx, "nvfp4") == rows * (40 - 128)


def test_bytes_read_counts_only_the_window():
    from dataclasses import replace
    cfg = PRESETS["mistral-7b"]
    wide, narrow = bytes_read(cfg, 8000), bytes_read(replace(cfg, sliding_window=None), 8000)
    assert narrow - wide == 2 * 2 * cfg.n_layers * cfg.n_kv_heads * (8001 - 4096) * cfg.head_dim


def test_moe_oracle_follows_near_ties_only():
    """The bench's MoE oracle takes megavm's experts where they differ from its own by a near-tie, and
    counts a larger difference as a routing error."""
    import torch

    from megavm.flywheel.bench import ROUTE_TIE, FollowNearTies
    from megavm.schedule.models import PRESETS
    cfg = PRESETS["moe-tiny"]                               # 8 experts, top 2, softmax, renormalised

    class Chose:
        def __init__(self, ids):
            self.ids = torch.tensor(ids, dtype=torch.int32)

        def buffer(self, name):
            return self.ids
    logits = torch.tensor([0.0, 3.0, 0.5, 2.0, 0.1, 2.0 - ROUTE_TIE / 4, -1.0, 0.2])
    same = FollowNearTies(cfg, Chose([3, 1]))
    ids, w = same(0, logits)
    assert sorted(ids.tolist()) == [1, 3] and (same.ties, same.errors) == (0, 0)
    tie = FollowNearTies(cfg, Chose([1, 5]))
    ids, w = tie(0, logits)
    assert ids.tolist() == [1, 5] and (tie.ties, tie.errors) == (1, 0) and abs(float(w.sum()) - 1) < 1e-6
    far = FollowNearTies(cfg, Chose([1, 2]))
    ids, _ = far(0, logits)
    assert sorted(ids.tolist()) == [1, 3] and far.errors == 1


def test_kernel_time_switch_parses_schedule_changes_and_names_bad_ones():
    from megavm.flywheel.kernel_time import switch
    assert switch("weights='fp8'") == {"weights": "fp8"} and switch("fuse_norm=False") == {"fuse_norm": False}
    assert switch("MVM_INFLIGHT=4") == {"defines": {"MVM_INFLIGHT": 4}}
    assert switch("inline_combine=True+MVM_INLINE_TASKS=1+MVM_STAGES=8") == {
        "inline_combine": True, "defines": {"MVM_INLINE_TASKS": 1, "MVM_STAGES": 8}}
    for bad, words in (("bogus=1", "not FIELD=VALUE"), ("kv_block=", "not FIELD=VALUE"),
                       ("weights=fp8", "not a Python value"), ("MVM_STAGES=True", "takes an integer"),
                       ("MVM_STAGES=4.5", "takes an integer")):
        with pytest.raises(ValueError, match=words):
            switch(bad)


def test_kernel_time_rows_carry_the_layer_chain_and_the_doc_validates(monkeypatch, tmp_path, capsys):
    """main() writes a doc the results schema takes, rows with the layer's chain against the queues
    (run() itself needs a GPU: here it is replaced by one that returns such a row)."""
    import json

    from megavm.flywheel import kernel_time, results
    from megavm.schedule.config import ScheduleConfig
    from megavm.schedule.fit import chain_tasks
    from megavm.schedule.models import PRESETS
    chain = chain_tasks(PRESETS["llama-1b"], ScheduleConfig(capacity=288, n_sms=132))

    def fake_run(model, ctx, ablations, defines=None, **schedule):
        return dict(model=model, ctx=ctx, ablations="baseline", verdict="PASS", rel_err=1e-3, kernel_ms=1.0,
                    generate_ms=1.0, GBps=2400.0, GB=2.4, chain_tasks=chain, queues=132)
    monkeypatch.setattr(kernel_time, "run", fake_run)
    monkeypatch.setattr(kernel_time.torch.cuda, "get_device_name", lambda i=0: "NVIDIA H100 80GB HBM3")
    monkeypatch.setenv("MEGAVM_COMMIT", "abc1234")
    assert kernel_time.main(["--models", "llama-1b", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    # 8 KV heads x (8 q, 3 k and 3 v tiles, and one partial: one KV block a head at capacity 288)
    assert f"{chain}/132" in out and chain == 120, out
    doc = json.loads(next((tmp_path / "kernel_time").glob("*.json")).read_text())
    assert results.validate(doc) == [] and doc["rows"][0]["chain_tasks"] == 120


def test_commit_names_a_dirty_checkout(monkeypatch):
    """A result measured on a tree that differs from HEAD is not that commit's: it says -dirty."""
    import subprocess
    from megavm.flywheel import bench
    monkeypatch.delenv("MEGAVM_COMMIT", raising=False)
    answers = {"rev-parse": "abc1234\n", "status": ""}

    def fake_run(cmd, **kw):
        return subprocess.CompletedProcess(cmd, 0, answers[cmd[1]], "")
    monkeypatch.setattr(bench.subprocess, "run", fake_run)
    assert bench.commit() == "abc1234"
    answers["status"] = " M instructions/attn_partial.cuh\n"
    assert bench.commit() == "abc1234-dirty"
    monkeypatch.setenv("MEGAVM_COMMIT", "given")
    assert bench.commit() == "given"


def test_model_weights_draw_experts_once_and_describe_one_model():
    """bench's (and kernel_time's) weights of a mixture of experts: each Hugging Face expert matrix is a
    view into the program's stack (a 30B-A3B model is on the GPU once), and the two dicts are the same
    model: ReferenceVM on the program weights decodes the eager model's token, logits within 2e-2 of
    the largest (bf16 weights)."""
    from megavm.flywheel.bench import model_weights
    from megavm.schedule.weights import expert_names
    from megavm.vm.compile import compile
    from megavm.vm.reference import ReferenceVM
    cfg = PRESETS["moe-tiny"]
    hf, prog = model_weights(cfg, seed=3, device="cpu")
    moe = [l for l in range(cfg.n_layers) if cfg.is_moe(l)]
    assert moe
    for l in moe:
        _, names = expert_names(cfg, l)
        for e, (gate, up, down) in enumerate(names):
            for name, stack in ((gate, "experts_gate"), (up, "experts_up"), (down, "experts_down")):
                t = hf[f"model.layers.{l}.{name}"]
                assert t.data_ptr() == prog[f"layers.{l}.{stack}"][e].data_ptr(), f"layer {l} expert {e} {name}"
    packed = compile(cfg, ScheduleConfig(dtype="bf16", capacity=16))
    ref = ReferenceVM(packed, {k: v for k, v in prog.items() if k in packed.names})
    eager = EagerDecoder(cfg, hf, 16)
    for pos, tok in enumerate((3, 17)):
        out = ref.step({"token": tok, "pos": pos})
        want = eager.step(tok, pos)
        assert int(out["next_token"][0]) == int(want.argmax())
        assert (out["logits"] - want).abs().max() <= 2e-2 * want.abs().max()
