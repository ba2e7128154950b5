"""Kernel-only and generation time of the megakernel on seeded random bf16 weights, for A/B work: the
baseline, and with --ablate every runtime and schedule ablation in the same process, each with the
first step's verdict against the eager model beside it (a sampling program, `--switch sample=True`: its
first step greedy, the timed ones at temperature 0.8, top-k 32, top-p 0.95). flywheel/gpu_check.sh runs it.

  python3 -m megavm.flywheel.kernel_time --models small,llama-1b [--ctx N] [--ablate]
  python3 -m megavm.flywheel.kernel_time --models llama-1b --switch MVM_INFLIGHT=4 --passes 2
"""
from __future__ import annotations

import argparse
import ast
import json
import math
import os
import sys
import time
from dataclasses import replace

import torch

from megavm.core.limits import BUILD_SIZED, KNOBS
from megavm.flywheel import results
from megavm.flywheel.bench import FollowNearTies, bytes_read, fill_history, model_weights, out_dir, run_doc
from megavm.flywheel.timing import median_ms
from megavm.flywheel.trace import summarize
from megavm.schedule.config import ScheduleConfig
from megavm.schedule.eager import EagerDecoder
from megavm.schedule.fit import chain_tasks, fit_chain
from megavm.schedule.models import PRESETS, ModelConfig
from megavm.schedule.weights import program_weights, quantized_model, random_hf_weights, stored
from megavm.vm.compile import compile
from megavm.vm.megakernel import Ablations, MegakernelVM
from megavm.vm.sizing import describe
from megavm.vm.verify import VS_EAGER, FollowKVCodes

# (runtime ablations, schedule changes): the baseline first, then every switch
VARIANTS = [(Ablations(), {}), (Ablations(direct_loads=True), {}), (Ablations(attn_history=False), {}),
            (Ablations(evict_first=False), {}), (Ablations(), {"strategy": "balanced"}),
            (Ablations(host_loop=True), {}), (Ablations(), {"head_counters": False}),
            (Ablations(), {"kv_block": "capacity"}), (Ablations(), {"attn_direct": False}),
            (Ablations(), {"fuse_combine": True}),
            (Ablations(), {"fuse_norm": False}), (Ablations(), {"fuse_rope": False}),
            (Ablations(), {"fuse_residual": False}), (Ablations(), {"fuse_argmax": False}),
            (Ablations(), {"split_head_norm": False}), (Ablations(), {"tagged": False})]


def switch(text: str) -> dict:
    """--switch FIELD=VALUE as a ScheduleConfig change (VALUE is Python: False, 64, 'fp8'), or
    --switch KNOB=N as a build knob of core/limits.py (MVM_STAGES=8): {"defines": {KNOB: N}}. Changes
    joined by + are one variant (inline_combine=True+MVM_INLINE_TASKS=1)."""
    if "+" in text:
        out: dict = {}
        for part in text.split("+"):
            one = switch(part)
            out.update({k: v for k, v in one.items() if k != "defines"})
            if "defines" in one:
                out.setdefault("defines", {}).update(one["defines"])
        return out
    k, _, v = text.partition("=")
    knobs = {x.name for x in KNOBS} | set(BUILD_SIZED)
    if k not in ScheduleConfig.__dataclass_fields__ and k not in knobs or not v:
        raise ValueError(f"--switch {text!r}: not FIELD=VALUE of a ScheduleConfig field or KNOB=N of a build knob")
    try:
        value = ast.literal_eval(v)
    except (ValueError, SyntaxError):
        raise ValueError(f"--switch {text!r}: {v!r} is not a Python value (a string needs quotes: 'fp8')") from None
    if k in knobs:
        if type(value) is not int:
            raise ValueError(f"--switch {text!r}: a build knob takes an integer")
        return {"defines": {k: value}}
    return {k: value}


def setup(model: str | ModelConfig, ctx: int, ablations: Ablations = Ablations(), defines: dict | None = None,
          **schedule):
    """The VM of one configuration (a preset's name or a model config) on seeded random weights and a
    random KV history before ctx, after one step at ctx checked against the eager model: (vm, packed, weights, cfg, schedule config, verdict row
    fields). `schedule` holds ScheduleConfig changes (kv_block="capacity": one block), `defines` build
    knobs (a build of their own)."""
    cfg = PRESETS[model] if isinstance(model, str) else model
    cap = ctx + 160
    if schedule.get("kv_block") == "capacity":
        schedule["kv_block"] = cap
    n_sms = torch.cuda.get_device_properties(0).multi_processor_count
    sc = replace(ScheduleConfig(dtype="bf16", capacity=cap, n_sms=n_sms), **schedule)
    if sc.weights:                   # the oracle: the model the codes and scales stand for
        cfg, hf = quantized_model(cfg, random_hf_weights(cfg, torch.bfloat16, seed=0, device="cuda"), sc.weights)
        prog = program_weights(cfg, hf)
    else:                            # as bench draws them: a mixture of experts's stacks once (a 30B-A3B fits)
        hf, prog = model_weights(cfg)
    packed = compile(cfg, sc)
    w = stored(prog, [packed.buffer(i) for i in range(len(packed.buffers))], sc.weights)
    vm = MegakernelVM(packed, w, ablations=ablations, defines=defines or None)
    eager = EagerDecoder(cfg, hf, cap, kv_cache=sc.kv_cache)
    follow = FollowNearTies(cfg, vm) if cfg.n_experts else None     # routing near-ties, as bench's verdict
    eager.route_override = follow
    eager.kv_follow = FollowKVCodes(vm)                             # code near-ties, as bench's verdict
    fill_history(cfg, ctx, eager, [vm.buffer], kv_cache=sc.kv_cache)   # the step reads ctx random keys, not zeros
    res = vm.run({"token": 7, "pos": ctx} | draws(vm, greedy=True))
    ref = eager.step(7, ctx)
    err = ((res.logits - ref).abs().max() / ref.abs().max()).item()
    codes = eager.kv_follow
    ok = res.token == int(ref.argmax()) and err <= VS_EAGER["bf16"].value and \
        (follow is None or follow.errors == 0) and (codes is None or codes.errors == 0)
    # a probe build's logits may hold NaN (results wrong by construction): FAIL, and no error recorded
    verdict = dict(verdict="PASS" if ok else "FAIL") | (dict(rel_err=err) if math.isfinite(err) else {})
    return vm, packed, w, cfg, sc, verdict


def draws(vm, greedy: bool = False) -> dict:
    """A sampling program's settings and seed (schedule.sample): greedy for the verdict's step, else
    temperature 0.8, top-k 32, top-p 0.95 for the timed ones; {} for a greedy program."""
    if "sampling" not in vm.inputs.names:
        return {}
    return {"sampling": torch.tensor([0.0, 0.0, 1.0] if greedy else [0.8, 32.0, 0.95]), "seed": 1}


def run(model: str, ctx: int, ablations: Ablations, defines: dict | None = None, **schedule) -> dict:
    """Time one configuration (setup's arguments)."""
    vm, packed, w, cfg, sc, verdict = setup(model, ctx, ablations, defines, **schedule)
    if draws(vm):
        vm.run({"token": 7, "pos": ctx} | draws(vm)).wait()    # relaunch times these settings
    ms = median_ms(vm.relaunch)
    vm.generate([7], 8, start_pos=ctx, inputs=draws(vm))
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    vm.generate([7], 128, start_pos=ctx, inputs=draws(vm))
    gen_ms = (time.perf_counter() - t0) * 1e3 / 128
    nbytes = bytes_read(cfg, ctx, sc.weights, sc.kv_cache)
    label = ", ".join([f"{k}={v}" for k, v in vars(ablations).items() if v != getattr(Ablations(), k)] +
                      [f"schedule.{k}={v}" for k, v in schedule.items()] +
                      [f"build.{k}={v}" for k, v in (defines or {}).items()]) or "baseline"
    row = dict(model=model, ctx=ctx, ablations=label, **verdict, kernel_ms=ms, generate_ms=gen_ms,
               GBps=nbytes / ms / 1e6, GB=nbytes / 1e9,
               # a layer's queued run through its last partial, against the queues (schedule/fit.py)
               chain_tasks=chain_tasks(cfg, fit_chain(cfg, sc)), queues=sc.n_sms, build=describe(vm.defines))
    # storage formats and sampling: their timelines too
    if ablations == Ablations() and set(schedule) <= {"weights", "kv_cache", "sample"}:
        traced = MegakernelVM(packed, w, trace=True, defines=defines or None)
        for _ in range(3):
            traced.run({"token": 7, "pos": ctx} | draws(traced)).wait()
        row["timeline"] = summarize(traced.timeline(), packed)
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="small,llama-1b")
    ap.add_argument("--ctx", type=int, default=128)
    ap.add_argument("--ablate", action="store_true", help="every ablation after the baseline")
    ap.add_argument("--out", metavar="DIR", help="where the JSON goes (default: $OUT, else the current directory)")
    ap.add_argument("--note", default="kernel_time", help="what the run is for, recorded with it")
    ap.add_argument("--switch", action="append", default=[], metavar="FIELD=VALUE",
                    help="a ScheduleConfig change, or a build knob (MVM_STAGES=8), to time after the baseline "
                         "(repeatable; VALUE is Python: False, 64; A=1+B=2 is one variant)")
    ap.add_argument("--passes", type=int, default=1, help="times through baseline and variants, alternating (A/B)")
    a = ap.parse_args(argv)
    switches = []
    for sw in a.switch:
        try:
            switches.append((Ablations(), switch(sw)))
        except ValueError as e:
            ap.error(str(e))
    variants = (VARIANTS if a.ablate else VARIANTS[:1]) + switches
    rows = []
    for m in a.models.split(","):
        for ab, sched in variants * a.passes:
            if "split_head_norm" in sched and not PRESETS[m].qk_norm:
                continue                               # the same program as the baseline's
            rows.append(run(m, a.ctx, ab, **sched))
            print(json.dumps(rows[-1]), flush=True)
    flags = os.environ.get("MEGAVM_NVCC_FLAGS", "")
    command = "python3 -m megavm.flywheel.kernel_time " + " ".join(argv if argv is not None else sys.argv[1:])
    note = a.note + (f" (MEGAVM_NVCC_FLAGS={flags})" if flags else "")
    timelines = [(r["model"], r["ctx"], r["ablations"], r.pop("timeline")) for r in rows if "timeline" in r]
    print(f"results: {results.write(run_doc('kernel_time', command, note, rows=rows), out_dir(a.out))}")
    for model, ctx, label, tl in timelines:
        results.write(run_doc("trace", command, f"{note}: the timeline of {label}", model=model, ctx=ctx, **tl),
                      out_dir(a.out))
    print(f"{'model':10s} {'ctx':>5s} {'ms':>8s} {'gen ms':>8s} {'GB/s':>7s} {'chain':>7s} verdict  ablations {flags}")
    for r in rows:
        print(f"{r['model']:10s} {r['ctx']:5d} {r['kernel_ms']:8.3f} {r['generate_ms']:8.3f} {r['GBps']:7.0f} "
              f"{r['chain_tasks']:3d}/{r['queues']:<3d} {r['verdict']:7s} {r['ablations']}")
    return 0 if all(r["verdict"] == "PASS" for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
