"""`megavm trace`: the per-instruction timeline of one launch (start, waits satisfied, end, block),
as Chrome-trace JSON (open in Perfetto), a PNG plot, and a per-opcode summary."""
from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import numpy as np

from megavm.instructions import op_name
from megavm.vm.pack import PackedProgram


def task_ops(packed: PackedProgram) -> np.ndarray:
    """Opcode of each task, in task order."""
    return packed.instrs["opcode"][np.argsort(packed.instrs["task"])]


def chrome_trace(tl: np.ndarray, packed: PackedProgram) -> dict:
    """tl: [n_tasks, 4] (start ns, waited ns, end ns, block). One track per block; a task is a wait
    slice followed by a run slice named by its label."""
    labels = packed.meta.get("labels") or [str(i) for i in range(len(tl))]
    ops = task_ops(packed)
    t0 = int(tl[:, 0].min())
    ev = []
    for i, (s, w, e, b) in enumerate(tl.astype(np.int64)):
        if w > s:
            ev.append({"name": "wait", "cat": "wait", "ph": "X", "ts": (s - t0) / 1e3, "dur": (w - s) / 1e3,
                       "pid": 0, "tid": int(b)})
        ev.append({"name": labels[i], "cat": op_name(int(ops[i])), "ph": "X", "ts": (w - t0) / 1e3,
                   "dur": (e - w) / 1e3, "pid": 0, "tid": int(b), "args": {"task": i}})
    return {"traceEvents": ev, "displayTimeUnit": "ns"}


def summarize(tl: np.ndarray, packed: PackedProgram) -> dict:
    """Span, and per opcode: tasks, mean wait and run (us), and the weight bandwidth a run reached on its SM."""
    tl = tl.astype(np.int64)
    ops = task_ops(packed)
    nbytes = packed.instrs["streams"]["byte_count"].sum(axis=1)[np.argsort(packed.instrs["task"])]
    span = tl[:, 2].max() - tl[:, 0].min()
    blocks = int(tl[:, 3].max()) + 1
    busy = (tl[:, 2] - tl[:, 1]).sum()
    out = {"span_us": span / 1e3, "blocks": blocks, "run_fraction": float(busy / (span * blocks)), "ops": {}}
    for op in np.unique(ops):
        m = ops == op
        run = (tl[m, 2] - tl[m, 1]).sum()
        out["ops"][op_name(int(op))] = {
            "tasks": int(m.sum()), "wait_us": float((tl[m, 1] - tl[m, 0]).mean() / 1e3),
            "run_us": float((tl[m, 2] - tl[m, 1]).mean() / 1e3),
            "GBps_per_sm": float(nbytes[m].sum() / run) if run else 0.0}
    out["stages"] = stages(tl, packed)
    return out


def stage_name(counter: str) -> str:
    """A counter's name without its layer, head and index: L3.qkv.h2 -> qkv, x.4 -> x, xn.4.norm -> xn.norm."""
    return re.sub(r"\.\d+", "", re.sub(r"^L\d+\.|\.h\d+$", "", counter))


def stages(tl: np.ndarray, packed: PackedProgram) -> dict:
    """Where the step's time goes along its dependency chain. A counter is ready when its last producer
    ends; its stage time runs from the moment the counters its producers wait on were all ready (the
    launch's first instruction for roots) to that end: the hand-off, the wait and the work of the
    stage's slowest task. Per stage (counters of every layer and head together): how many, mean and
    max in us, in program order; the tail: how long after its median producer the last one ended, the
    mean over the stage's counters; and the SM tail: how long after the median SM's last producer the
    last one ended (what a static split of the stage pays for its slowest SM; the same as the tail where
    each SM runs one producer, far less where each runs several, as the LM head's tiles)."""
    names = packed.meta.get("counters") or [f"c{i}" for i in range(len(packed.counter_producers))]
    order = np.argsort(packed.instrs["task"])
    ins = packed.instrs[order]
    tl = tl.astype(np.int64)
    ready = np.full(len(names), -1, np.int64)
    ends: dict[int, list[int]] = {}
    sm_ends: dict[int, dict[int, int]] = {}       # per counter, each SM's last producer end
    for t, r in enumerate(ins):
        if r["signal"] >= 0:
            ready[r["signal"]] = max(ready[r["signal"]], tl[t, 2])
            ends.setdefault(int(r["signal"]), []).append(int(tl[t, 2]))
            last = sm_ends.setdefault(int(r["signal"]), {})
            last[int(tl[t, 3])] = max(last.get(int(tl[t, 3]), 0), int(tl[t, 2]))
    t0 = int(tl[:, 0].min())
    start = np.full(len(names), t0, np.int64)
    for t, r in enumerate(ins):
        if r["signal"] >= 0:
            for w in r["waits"][:r["n_waits"]]:
                start[r["signal"]] = max(start[r["signal"]], ready[w["counter"]])
    out: dict[str, list[float]] = {}
    tails: dict[str, list[float]] = {}
    sm_tails: dict[str, list[float]] = {}
    for c in np.flatnonzero(ready >= 0):
        k = stage_name(names[c])
        out.setdefault(k, []).append((ready[c] - start[c]) / 1e3)
        tails.setdefault(k, []).append((ready[c] - np.median(ends[int(c)])) / 1e3)
        sm_tails.setdefault(k, []).append((ready[c] - np.median(list(sm_ends[int(c)].values()))) / 1e3)
    return {k: {"count": len(v), "mean_us": float(np.mean(v)), "max_us": float(np.max(v)),
                "tail_us": float(np.mean(tails[k])), "sm_tail_us": float(np.mean(sm_tails[k]))}
            for k, v in out.items()}


def plot(tl: np.ndarray, packed: PackedProgram, path: Path) -> bool:
    """One row per block: waits grey, runs coloured by opcode. False when matplotlib is missing."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    tl = tl.astype(np.int64)
    t0 = tl[:, 0].min()
    ops = task_ops(packed)
    fig, ax = plt.subplots(figsize=(16, 8))
    cmap = plt.get_cmap("tab10")
    for op in np.unique(ops):
        m = ops == op
        ax.barh(tl[m, 3], (tl[m, 2] - tl[m, 1]) / 1e3, left=(tl[m, 1] - t0) / 1e3, height=0.9,
                color=cmap(int(op) % 10), label=op_name(int(op)))
    ax.barh(tl[:, 3], (tl[:, 1] - tl[:, 0]) / 1e3, left=(tl[:, 0] - t0) / 1e3, height=0.9, color="0.85", label="wait")
    ax.set_xlabel("us since the first instruction")
    ax.set_ylabel("block (SM)")
    ax.legend(loc="upper right", fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def setup_trace(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="llama-1b", help="preset (default: llama-1b)")
    p.add_argument("--ctx", type=int, default=128, help="position the traced step decodes at (default: 128)")
    p.add_argument("--out", default="trace", help="folder for trace.json, timeline.png and the summary, a "
                                                  "run in flywheel/results.py's trace schema (default: ./trace)")


def cmd_trace(a: argparse.Namespace) -> int:
    """Record one launch's per-instruction timeline; write Chrome-trace JSON, a PNG and a summary."""
    import torch

    from megavm.flywheel import results
    from megavm.flywheel.bench import model_weights, require_gpu, run_doc
    require_gpu(a.ctx, [a.model])
    from megavm.schedule.config import ScheduleConfig
    from megavm.schedule.models import preset
    from megavm.vm.compile import compile
    from megavm.vm.megakernel import MegakernelVM
    cfg = preset(a.model)
    n_sms = torch.cuda.get_device_properties(0).multi_processor_count
    packed = compile(cfg, ScheduleConfig(dtype="bf16", capacity=a.ctx + 16, n_sms=n_sms))
    w = model_weights(cfg)[1]
    vm = MegakernelVM(packed, w, trace=True)
    for _ in range(3):
        vm.run({"token": 7, "pos": a.ctx}).wait()
    tl = vm.timeline()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "trace.json").write_text(json.dumps(chrome_trace(tl, packed)))
    s = summarize(tl, packed)
    summary = run_doc("trace", f"megavm trace --model {a.model} --ctx {a.ctx}", "megavm trace", model=a.model,
                      ctx=a.ctx, **s)
    summary_path = results.write(summary, out)
    drew = plot(tl, packed, out / "timeline.png")
    print(f"span {s['span_us']:.1f} us over {s['blocks']} blocks, {100 * s['run_fraction']:.0f}% of block time running")
    for name, o in s["ops"].items():
        print(f"  {name:18s} {o['tasks']:6d} tasks  wait {o['wait_us']:6.2f} us  run {o['run_us']:6.2f} us  "
              f"{o['GBps_per_sm']:6.2f} GB/s per SM")
    print("stage (inputs ready -> last producer done)")
    for name, o in s["stages"].items():
        print(f"  {name:18s} {o['count']:6d} x  mean {o['mean_us']:7.2f} us  max {o['max_us']:7.2f} us  "
              f"last producer {o['tail_us']:5.2f} us after the median, {o['sm_tail_us']:5.2f} after the median SM's")
    print(f"wrote {out / 'trace.json'}, {summary_path}" +
          (f", {out / 'timeline.png'}" if drew else " (no PNG: matplotlib missing)"))
    return 0
