"""Run the loader probe (MVM_PROBE_LOADER=1, on main): python3 bench/research/loader_probe.py MODEL > LOG, then
python3 bench/research/loader_probe.py LOG.

Eight greedy steps of MODEL at ctx 128 on a build with the probe; the kernel prints each eighth block's loader
totals for the launch of epoch 5 ("LOADER ..." lines, ns): waits for a free ring stage and for copies to land,
and the same for late-bound (expert) copies alone with their spans (a layer's first late copy issued to its
last), the time in the walk and in issuing. Given the saved log, this prints the means over the blocks and a
late span's figures (docs/performance.md, session 54). Every timer read adds to what it measures."""
import os
import sys

import torch

from megavm.flywheel.bench import model_weights
from megavm.schedule.config import ScheduleConfig
from megavm.schedule.models import preset
from megavm.vm.compile import compile
from megavm.vm.megakernel import MegakernelVM


def main(model: str) -> None:
    cfg = preset(model)
    n = torch.cuda.get_device_properties(0).multi_processor_count
    packed = compile(cfg, ScheduleConfig(dtype="bf16", capacity=144, n_sms=n))
    vm = MegakernelVM(packed, model_weights(cfg)[1], defines={"MVM_PROBE_LOADER": 1})
    for _ in range(8):
        vm.run({"token": 7, "pos": 128}).wait()
    torch.cuda.synchronize()


def summarize(lines) -> None:
    rows = []
    for line in lines:
        if line.startswith("LOADER"):
            f = line.split()[1:]
            rows.append({k: int(v) for k, v in zip(f[0::2], f[1::2]) if k != "blk"})
    if not rows:
        sys.exit("no LOADER lines: was the log written by a build with MVM_PROBE_LOADER=1?")
    mean = {k: sum(r[k] for r in rows) / len(rows) for k in rows[0]}
    print(f"{len(rows)} blocks, mean ns:", " ".join(f"{k} {v:.0f}" for k, v in mean.items()))
    spans = mean["late_spans"]
    if spans:
        us = lambda k: mean[k] / spans / 1e3   # noqa: E731
        print(f"a late span: {us('late_span_ns'):.2f} us, {mean['late_bytes'] / spans / 1e3:.0f} KB in "
              f"{mean['late_copies'] / spans:.1f} copies ({mean['late_bytes'] / mean['late_span_ns']:.1f} GB/s); "
              f"waits: ring full {us('late_full_ns'):.2f} us, landing {us('late_landing_ns'):.2f}; "
              f"issuing {us('late_issue_ns'):.2f}")


if __name__ == "__main__":
    if len(sys.argv) > 1 and os.path.exists(sys.argv[1]):      # a saved log
        with open(sys.argv[1]) as f:
            summarize(f)
    else:
        main(sys.argv[1] if len(sys.argv) > 1 else "qwen3-30b-a3b")
