"""What LoRA costs the megakernel: a model's step without adapters, then a program holding one random
adapter of the given rank and targets, run with id 0 (none) and id 1; each with its verdict against the
eager model (the adapter unmerged) and the bytes of the adapter's A and B that id 1 reads. --producers
adds the same two with the partial products written by the input's producers instead of LORA_A tasks
(ScheduleConfig.lora_a_tasks=False), the A/B of that choice in one process; each --switch FIELD=VALUE adds
id 1 with that ScheduleConfig change (lora_a_rows=6).

  python3 -m megavm.flywheel.lora_bench --model llama-1b --rank 16 --targets q,k,v,o
"""
from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from megavm.core.limits import MAX_K
from megavm.flywheel import results
from megavm.flywheel.bench import bytes_read, out_dir, run_doc
from megavm.flywheel.kernel_time import switch
from megavm.flywheel.timing import median_ms
from megavm.flywheel.trace import summarize, task_ops
from megavm.instructions import op_name
from megavm.schedule.adapters import random_adapter
from megavm.schedule.config import ScheduleConfig
from megavm.schedule.eager import EagerDecoder
from megavm.schedule.lora_layout import LoraLayout, lora_weights
from megavm.schedule.models import PRESETS
from megavm.schedule.weights import program_weights, random_hf_weights
from megavm.vm.compile import compile
from megavm.vm.megakernel import MegakernelVM
from megavm.vm.verify import VS_EAGER, FollowKVCodes


def adapter_bytes(w: dict[str, torch.Tensor]) -> int:
    """Bytes of one adapter's slice of the stacked A and B buffers."""
    return sum(t[1].numel() * t.element_size() for n, t in w.items() if ".lora_" in n)


def measure(model: str, ctx: int, rank: int, targets: tuple[str, ...], trace: bool = False,
            producers: bool = False, switches: tuple[dict, ...] = (), dump: str | None = None) -> list[dict]:
    cfg = PRESETS[model]
    cap = ctx + 16
    sc = ScheduleConfig(dtype="bf16", capacity=cap, n_sms=torch.cuda.get_device_properties(0).multi_processor_count)
    hf = random_hf_weights(cfg, torch.bfloat16, seed=0, device="cuda")
    base_w = program_weights(cfg, hf)
    ad = random_adapter(cfg, rank, targets, seed=1)
    ad = replace(ad, a={k: v.bfloat16().float() for k, v in ad.a.items()},     # as a bf16 adapter file holds
                 b={k: v.bfloat16().float() for k, v in ad.b.items()})
    lsc = replace(sc, lora_adapters=1, lora_rank=rank, lora_targets=targets)
    lw = lora_weights(LoraLayout.of(cfg, lsc), [ad], base_w)
    rows = []
    name = f"rank {rank} on {','.join(targets)}"
    variants = [("no adapters", sc, {}, None), (f"{name}, id 0", lsc, {"adapter": 0}, None),
                (f"{name}, id 1", lsc, {"adapter": 1}, ad)]
    if producers:
        psc = replace(lsc, lora_a_tasks=False)
        variants += [(f"{name}, id 0, producers", psc, {"adapter": 0}, None),
                     (f"{name}, id 1, producers", psc, {"adapter": 1}, ad)]
    for sw in switches:
        variants.append((f"{name}, id 1, " + ",".join(f"{k}={v!r}" for k, v in sw.items()), replace(lsc, **sw),
                         {"adapter": 1}, ad))
    for label, vsc, inputs, adapter in variants:
        packed, w = compile(cfg, vsc), base_w if vsc is sc else base_w | lw
        # one build for every variant: sized to each program (vm/sizing.py), the step with adapters and the
        # one without would get different rings, and the adapters' cost would include that difference
        vm = MegakernelVM(packed, w, defines={"MEGAVM_MAX_K": MAX_K})
        res = vm.run({"token": 7, "pos": ctx, **inputs})
        eager = EagerDecoder(cfg, hf, cap, adapter)
        eager.kv_follow = codes = FollowKVCodes(vm)   # bf16 rows at rounding near-ties, as bench's verdict
        ref = eager.step(7, ctx)
        err = ((res.logits - ref).abs().max() / ref.abs().max()).item()
        token_ok = res.token == int(ref.argmax())
        ok = token_ok and err <= VS_EAGER["bf16"].value and codes.errors == 0
        ms = median_ms(vm.relaunch)
        nbytes = bytes_read(cfg, ctx) + (adapter_bytes(lw) if adapter else 0)
        rows.append(dict(model=model, ctx=ctx, ablations=label, verdict="PASS" if ok else "FAIL", rel_err=err,
                         token_ok=token_ok, kv_followed=codes.followed, kv_errors=codes.errors,
                         kernel_ms=ms, GBps=nbytes / ms / 1e6, GB=nbytes / 1e9))
        del vm
        if trace:                      # where the adapter's time goes: per opcode and per stage
            traced = MegakernelVM(packed, w, trace=True, defines={"MEGAVM_MAX_K": MAX_K})
            for _ in range(3):
                traced.run({"token": 7, "pos": ctx, **inputs}).wait()
            rows[-1]["timeline"] = summarize(traced.timeline(), packed)
            if dump:                   # the raw timeline, for a look task by task (flywheel/trace.py's columns)
                save_timeline(Path(dump) / f"timeline-{len(rows) - 1}.npz", traced.timeline(), packed, label)
            del traced
    rows[-1]["adapter_MB"] = adapter_bytes(lw) / 1e6
    return rows


def save_timeline(path: Path, tl, packed, label: str) -> None:
    """tl [tasks, 4] (start, waited, end ns, block) with each task's label and opcode name, as .npz."""
    path.parent.mkdir(parents=True, exist_ok=True)
    labels = packed.meta.get("labels") or [str(i) for i in range(len(tl))]
    np.savez_compressed(path, tl=np.asarray(tl), labels=np.array(labels),
                        ops=np.array([op_name(int(o)) for o in task_ops(packed)]), variant=label)


def print_timelines(timelines: list[tuple[str, dict]]) -> None:
    """Mean run time per opcode and mean time per stage (us), one column per variant."""
    print("us per task (run) and per stage, by variant:")
    for part, key in (("ops", "run_us"), ("stages", "mean_us")):
        names = list(dict.fromkeys(n for _, tl in timelines for n in tl.get(part, {})))
        for n in names:
            vals = [tl.get(part, {}).get(n, {}).get(key) for _, tl in timelines]
            print(f"  {part[:-1]:5s} {n:20s} " + " ".join("      -" if v is None else f"{v:7.2f}" for v in vals))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="llama-1b")
    ap.add_argument("--ctx", type=int, default=128)
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--targets", default="q,k,v,o")
    ap.add_argument("--out", metavar="DIR", help="where the JSON goes (default: $OUT, else the current directory)")
    ap.add_argument("--note", default="LoRA cost", help="what the run is for, recorded with it")
    ap.add_argument("--trace", action="store_true",
                    help="also trace each variant and write its timeline (per-opcode and per-stage times)")
    ap.add_argument("--producers", action="store_true",
                    help="also run ids 0 and 1 with the partial products written by the inputs' producers")
    ap.add_argument("--switch", action="append", default=[], metavar="FIELD=VALUE",
                    help="also run id 1 with this ScheduleConfig change (repeatable)")
    ap.add_argument("--dump", metavar="DIR", help="with --trace: also save each variant's raw timeline (.npz) there")
    a = ap.parse_args(argv)
    try:
        switches = tuple(switch(t) for t in a.switch)
    except ValueError as e:
        ap.error(str(e))
    if any("defines" in sw for sw in switches):
        ap.error("--switch takes ScheduleConfig fields here; build knobs need kernel_time")
    rows = measure(a.model, a.ctx, a.rank, tuple(a.targets.split(",")), a.trace, a.producers, switches, a.dump)
    command = "python3 -m megavm.flywheel.lora_bench " + " ".join(argv if argv is not None else sys.argv[1:])
    timelines = [(r["ablations"], r.pop("timeline")) for r in rows if "timeline" in r]
    print(f"results: {results.write(run_doc('kernel_time', command, a.note, rows=rows), out_dir(a.out))}")
    for label, tl in timelines:
        results.write(run_doc("trace", command, f"{a.note}: the timeline of {label}", model=a.model, ctx=a.ctx, **tl),
                      out_dir(a.out))
    if timelines:
        print_timelines(timelines)
    base = rows[0]["kernel_ms"]
    print(f"{'model':10s} {'ms':>8s} {'+us':>7s} verdict  what")
    for r in rows:
        print(f"{r['model']:10s} {r['kernel_ms']:8.3f} {1e3 * (r['kernel_ms'] - base):7.1f} {r['verdict']:7s} "
              f"{r['ablations']} (rel_err {r['rel_err']:.2g}, bf16 rows followed {r['kv_followed']}, beyond a rounding "
              f"{r['kv_errors']}{'' if r['token_ok'] else ', token differs'})")
    mb = rows[-1]["adapter_MB"]
    print(f"adapter A and B: {mb:.2f} MB, {mb / 3.0:.1f} us at 3 TB/s")
    return 0 if all(r["verdict"] == "PASS" for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
