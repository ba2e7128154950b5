"""Run the partial phase probe (partial-phase-probe.patch applied): python3 bench/research/partial_phases.py MODEL [1|2].

Eight greedy steps of MODEL at ctx 128 on a build with MVM_PROBE_PHASES; the kernel prints each partial of
the launch of epoch 5 ("PPH ..." lines), and this prints their means per shape."""
import collections
import os
import sys

import torch

from megavm.flywheel.bench import model_weights
from megavm.schedule.config import ScheduleConfig
from megavm.schedule.models import preset
from megavm.vm.compile import compile
from megavm.vm.megakernel import MegakernelVM


def main(model: str, mode: int) -> None:
    cfg = preset(model)
    n = torch.cuda.get_device_properties(0).multi_processor_count
    packed = compile(cfg, ScheduleConfig(dtype="bf16", capacity=144, n_sms=n))
    vm = MegakernelVM(packed, model_weights(cfg)[1], defines={"MVM_PROBE_PHASES": mode})
    for _ in range(8):
        vm.run({"token": 7, "pos": 128}).wait()
    torch.cuda.synchronize()


def summarize(lines) -> None:
    rows = collections.defaultdict(list)
    for line in lines:
        if line.startswith("PPH"):
            f = line.split()[1:]
            d = {k: int(v) for k, v in zip(f[0::2], f[1::2])}
            rows[f"G{d['G']} hd{d['hd']} n{d['n']}"].append(d)
    for key, rs in rows.items():
        names = [k for k in rs[0] if k not in ("blk", "h", "b", "G", "hd", "n")]
        print(key, f"({len(rs)} partials) mean ns:", " ".join(f"{k} {sum(r[k] for r in rs) / len(rs):.0f}" for k in names))


if __name__ == "__main__":
    if len(sys.argv) > 1 and os.path.exists(sys.argv[1]):      # a saved log
        summarize(open(sys.argv[1]))
    else:
        main(sys.argv[1] if len(sys.argv) > 1 else "qwen3-30b-a3b", int(sys.argv[2]) if len(sys.argv) > 2 else 1)
