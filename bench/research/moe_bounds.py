"""Bounds on an MoE step's expert stages: python3 bench/research/moe_bounds.py [HASH_LAYERS,...] [DEFINES;...]

qwen3-30b-a3b at ctx 128, each configuration's kernel time (relaunch median) and a three-step trace's stage
and task means. HASH_LAYERS (default 0,48): that many MoE layers take their experts' ids from a [vocab, top_k]
table of distinct random ids, written at the step's start, so the loaders stream the chosen experts as early
as a dense layer's weights (the router still gives the weights): the difference to 0 bounds what any shorter
router -> ROUTE -> loader hand-off can save. DEFINES: build defines per configuration, ';' between
configurations, '+' within one (e.g. 'MVM_INFLIGHT=3'); with bench/research/expert-no-math.patch applied,
'MVM_NOMATH=1' times the expert tiles' streams with no math in them.

A diagnostic, with no verdict: a hash-routed model has no oracle here, and MVM_NOMATH's results are wrong
by construction (flywheel/kernel_time.py times the product with one). docs/performance.md, session 55."""
import sys
from dataclasses import replace

import torch

from megavm.flywheel.bench import model_weights
from megavm.flywheel.timing import median_ms
from megavm.flywheel.trace import summarize
from megavm.schedule.config import ScheduleConfig
from megavm.schedule.models import PRESETS
from megavm.schedule.weights import stored
from megavm.vm.compile import compile
from megavm.vm.megakernel import MegakernelVM

STAGES = ("qkv", "attn", "mid", "router", "route", "experts", "x")
OPS = ("ROUTE", "EXPERT_GLU", "EXPERT_DOWN")


def main(hash_layers: list[int], defines: list[dict]) -> None:
    base = PRESETS["qwen3-30b-a3b"]
    n_sms = torch.cuda.get_device_properties(0).multi_processor_count
    weights = model_weights(base)[1]
    g = torch.Generator(device="cuda").manual_seed(3)
    for layer in range(base.n_layers):    # each row: the first top_k of a random permutation of the experts
        weights[f"layers.{layer}.hash_table"] = torch.rand(base.vocab, base.n_experts, generator=g, device="cuda") \
            .argsort(dim=1)[:, :base.top_k].to(torch.int32).contiguous()
    for d in defines:
        for h in hash_layers:
            packed = compile(replace(base, hash_layers=h), ScheduleConfig(dtype="bf16", capacity=288, n_sms=n_sms))
            w = stored({k: v for k, v in weights.items() if h or "hash_table" not in k},
                       [packed.buffer(i) for i in range(len(packed.buffers))], "")
            vm = MegakernelVM(packed, w, defines=d or None)
            vm.run({"token": 7, "pos": 128}).wait()
            ms = median_ms(vm.relaunch)
            del vm
            traced = MegakernelVM(packed, w, trace=True, defines=d or None)
            for _ in range(3):
                traced.run({"token": 7, "pos": 128}).wait()
            s = summarize(traced.timeline(), packed)
            del traced
            stages = " ".join(f"{k} {s['stages'][k]['mean_us']:.2f}" for k in STAGES if k in s["stages"])
            ops = " ".join(f"{k} wait {s['ops'][k]['wait_us']:.2f} run {s['ops'][k]['run_us']:.2f}"
                           for k in OPS if k in s["ops"])
            print(f"{d or 'default'} hash_layers={h}: {ms:.3f} ms; stages (us) {stages}; {ops}", flush=True)
            torch.cuda.empty_cache()


if __name__ == "__main__":
    hl = [int(x) for x in (sys.argv[1] if len(sys.argv) > 1 else "0,48").split(",")]
    ds = [{k: int(v) for k, v in (x.split("=") for x in c.split("+") if x)}
          for c in (sys.argv[2] if len(sys.argv) > 2 else "").split(";")]
    main(hl, ds)
