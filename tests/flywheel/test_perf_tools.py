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
    ready = {}
    for i, t in enumerate(prog.tasks):
        ready[t.signal] = max(ready.get(t.signal, 0), tl[i, 2])
    want = {}
    for c, r in ready.items():
        waits = [ready[w.counter] for i, t in enumerate(prog.tasks) if t.signal == c for w in t.waits]
        want.setdefault(stage_name(prog.counters[c].name), []).append((r - max(waits, default=0)) / 1e3)
    assert set(st) == set(want)
    for k, v in want.items():
        assert st[k]["count"] == len(v) and st[k]["mean_us"] == pytest.approx(np.mean(v)), k
        assert st[k]["max_us"] == pytest.approx(max(v)), k
