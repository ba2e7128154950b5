"""Kernel-only time, ablations A/B and the timeline summary of the megakernel on seeded random bf16 weights, with the
first step's correctness against the eager model beside it. Used by bench/gpu_check.sh."""
import argparse
import json
import os
import time

import torch

from schedule.eager import EagerLlama
from schedule.lower import LowerConfig
from schedule.models import PRESETS
from tests.gpu.harness import build
from vm.bench import bytes_read, commit as bench_commit, median_ms
from vm.megakernel import Ablations, MegakernelVM
from vm.trace import summarize


def run(model, ctx, ablations, **lower):
    """Time one configuration; `lower` holds LowerConfig ablations (head_counters, kv_block, fuse_*)."""
    cfg = PRESETS[model]
    cap = ctx + 160
    if lower.get("kv_block") == "capacity":
        lower["kv_block"] = cap
    _, packed, w, hf = build(cfg, LowerConfig(dtype="bf16", capacity=cap, **lower), seed=0)
    vm = MegakernelVM(packed, w, ablations=ablations)
    eager = EagerLlama(cfg, hf, cap)
    res = vm.run({"token": 7, "pos": ctx})
    ref = eager.step(7, ctx)
    err = ((res.logits - ref).abs().max() / ref.abs().max()).item()
    ok = res.token == int(ref.argmax()) and err < 2e-2
    ms = median_ms(vm.relaunch)
    vm.generate([7], 8, start_pos=ctx)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    vm.generate([7], 128, start_pos=ctx)
    gen_ms = (time.perf_counter() - t0) * 1e3 / 128
    nbytes = bytes_read(cfg, ctx)
    label = ", ".join([f"{k}={v}" for k, v in vars(ablations).items() if v != getattr(Ablations(), k)] +
                      [f"lower.{k}={v}" for k, v in lower.items()]) or "baseline"
    row = dict(model=model, ctx=ctx, ablations=label, verdict="PASS" if ok else "FAIL", rel_err=err,
               kernel_ms=ms, generate_ms=gen_ms, GBps=nbytes / ms / 1e6, GB=nbytes / 1e9)
    if ablations == Ablations() and not lower:
        row["timeline"] = timeline_summary(packed, w, ctx)
    return row


def timeline_summary(packed, w, ctx):
    vm = MegakernelVM(packed, w, trace=True, validate=False)
    for _ in range(3):
        vm.run({"token": 7, "pos": ctx}).wait()
    return summarize(vm.timeline(), packed)


# (runtime ablations, LowerConfig ablations): the baseline first, then every switch
VARIANTS = [(Ablations(), {}), (Ablations(direct_loads=True), {}), (Ablations(attn_history=False), {}),
            (Ablations(evict_first=False), {}), (Ablations(assignment="round_robin"), {}),
            (Ablations(host_loop=True), {}), (Ablations(), {"head_counters": False}),
            (Ablations(), {"kv_block": "capacity"}), (Ablations(), {"fuse_combine": True}),
            (Ablations(), {"fuse_norm": False}), (Ablations(), {"fuse_rope": False}),
            (Ablations(), {"fuse_residual": False}), (Ablations(), {"fuse_argmax": False})]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="small,llama-1b")
    ap.add_argument("--ctx", type=int, default=128)
    ap.add_argument("--ablate", action="store_true")
    ap.add_argument("--json", default="kernel_time.json", help="file name under $OUT")
    a = ap.parse_args()
    rows = []
    for m in a.models.split(","):
        model_rows = [run(m, a.ctx, ab, **lower) for ab, lower in (VARIANTS if a.ablate else VARIANTS[:1])]
        for r in model_rows:
            print(json.dumps(r), flush=True)
        rows += model_rows
    out = os.environ.get("OUT", "/tmp")
    with open(os.path.join(out, a.json), "w") as f:
        json.dump(dict(device=torch.cuda.get_device_name(0), rows=rows,
                       commit=bench_commit(),
                       date=time.strftime("%Y-%m-%d")), f, indent=1)
    flags = os.environ.get("MEGAVM_NVCC_FLAGS", "")
    print(f"{'model':10s} {'ctx':>5s} {'ms':>8s} {'gen ms':>8s} {'GB/s':>7s} verdict  ablations {flags}")
    for r in rows:
        print(f"{r['model']:10s} {r['ctx']:5d} {r['kernel_ms']:8.3f} {r['generate_ms']:8.3f} {r['GBps']:7.0f} "
              f"{r['verdict']:7s} {r['ablations']}")


if __name__ == "__main__":
    main()
