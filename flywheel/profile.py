"""Where the megakernel's warps stall, by SASS instruction: one step under Nsight Compute's warp-state
sampling, and a summary of the samples by function, instruction and stall reason.

  ncu --profile-from-start off --clock-control none --section WarpStateStats --section SourceCounters \\
      -o DIR/step python3 -m megavm.flywheel.profile --model llama-7b-32k [--ctx N] [--switch F=V] [--layers N]
  python3 -m megavm.flywheel.profile --summarize DIR/step.ncu-rep [--top 40]

The first form builds the configuration as kernel_time does (seeded random weights, one step checked
against the eager model), then runs one more step between cudaProfilerStart and Stop, so ncu sees
that launch alone. The second reads the report's source page (SASS) back through ncu.
"""
from __future__ import annotations

import argparse
import csv
import gzip
import io
import subprocess
from collections import defaultdict
from dataclasses import replace

from megavm.schedule.models import PRESETS


def profile(model: str, ctx: int, schedule: dict, layers: int = 0) -> None:
    import torch

    from megavm.flywheel.kernel_time import setup
    from megavm.flywheel.trace import summarize as summarize_timeline
    from megavm.vm.megakernel import MegakernelVM
    cfg = replace(PRESETS[model], n_layers=layers) if layers else PRESETS[model]   # fewer layers, same shape
    vm, packed, w, _, _, verdict = setup(cfg, ctx, **schedule)
    err = f"rel err {verdict['rel_err']:.2e}" if "rel_err" in verdict else "no finite rel err"
    print(f"{model} ctx {ctx} {schedule or ''}: {verdict['verdict']} ({err})")
    traced = MegakernelVM(packed, w, trace=True, defines=schedule.get("defines"))   # stages, outside the profiled launch
    for _ in range(3):
        traced.run({"token": 7, "pos": ctx}).wait()
    tl = summarize_timeline(traced.timeline(), packed)
    print("stages (mean us):", {k: round(v["mean_us"], 2) for k, v in tl["stages"].items()})
    for op, v in tl["ops"].items():
        print(f"  {op:20s} tasks {v['tasks']:6d}  wait {v['wait_us']:7.2f} us  run {v['run_us']:7.2f} us")
    del traced
    for _ in range(5):
        vm.relaunch()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    vm.relaunch().wait()
    torch.cuda.cudart().cudaProfilerStop()


def _num(s: str) -> float:
    try:
        return float(s.replace(",", ""))
    except ValueError:
        return 0.0


def summarize(report: str, top: int) -> str:
    """The report's SASS rows with their stall samples: totals by reason, then the top instructions."""
    if report.endswith(".csv.gz"):                 # the source page, saved
        with gzip.open(report, "rt") as f:
            text = f.read()
    else:
        text = subprocess.run(["ncu", "--import", report, "--page", "source", "--csv", "--print-source", "sass"],
                              check=True, capture_output=True, text=True).stdout
    rows = list(csv.DictReader(io.StringIO(text[text.index('"Address"'):])))
    if not rows:
        return "no source rows in the report"
    cols = list(rows[0])
    samples = next(c for c in cols if c.startswith("Warp Stall Sampling (All"))
    reasons = [c for c in cols if c.startswith("stall_") and "Not Issued" not in c]
    src = next(c for c in cols if c == "Source")
    addr = next(c for c in cols if "Address" in c)
    total = sum(_num(r[samples]) for r in rows) or 1.0
    by_reason = defaultdict(float)
    for r in rows:
        for c in reasons:
            by_reason[c] += _num(r[c])
    out = [f"{len(rows)} SASS rows, {total:.0f} samples", "", "by reason:"]
    out += [f"  {c:50s} {v / total:6.1%}" for c, v in sorted(by_reason.items(), key=lambda kv: -kv[1]) if v]
    out += ["", f"top {top} instructions:"]
    for r in sorted(rows, key=lambda r: -_num(r[samples]))[:top]:
        why = sorted(((c, _num(r[c])) for c in reasons), key=lambda kv: -kv[1])[:3]
        out.append(f"  {r[addr]:>8s} {_num(r[samples]) / total:6.2%}  {r[src][:60]:60s} "
                   + " ".join(f"{c.split('(')[0].strip()[-24:]}={v:.0f}" for c, v in why if v))
    return "\n".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="llama-1b")
    ap.add_argument("--ctx", type=int, default=128)
    ap.add_argument("--switch", action="append", default=[], metavar="FIELD=VALUE",
                    help="a ScheduleConfig change (VALUE is Python: 'fp8', False, 64)")
    ap.add_argument("--layers", type=int, default=0, help="the preset with this many layers (0: as it is)")
    ap.add_argument("--summarize", metavar="REPORT", help="summarize an ncu report instead of profiling")
    ap.add_argument("--top", type=int, default=40)
    a = ap.parse_args(argv)
    if a.summarize:
        print(summarize(a.summarize, a.top))
        return 0
    from megavm.flywheel.kernel_time import switch
    sched = {}
    for sw in a.switch:
        try:
            change = switch(sw)
        except ValueError as e:
            ap.error(str(e))
        sched |= {k: sched.get(k, {}) | v if k == "defines" else v for k, v in change.items()}
    profile(a.model, a.ctx, sched, a.layers)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
