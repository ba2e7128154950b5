"""The chain's phase probe (chain-phase-probe.patch): trace launches of a build with MVM_PROBE_PARTIAL and
summarise where the partials and the q/k/v/o tiles spend their time.

    git apply bench/research/chain-phase-probe.patch      # on 73c0c9c
    PYTHONPATH=. python3 bench/research/chain_phases.py llama-1b:128 [--mode 1|2]

The probe build packs three phase ends (ns after the task's waits, 18 bits each) above the block id in the
trace's fourth word. Mode 1: partial q and own rows in / scores / values; register-path tiles first landed
stage / first stage + its cycles to the last / last landed stage (row-per-warp tiles: x loaded / GEMV done).
Mode 2: the partial's score loop twice (cold, then warm code). Times are us after the stage's inputs were
ready (a partial: its own head's q/k/v; a q/k/v tile: x; an o tile: the attention output).
"""
import argparse
import re
from collections import defaultdict

import numpy as np

from megavm.flywheel.kernel_time import setup
from megavm.vm.megakernel import MegakernelVM


def phases(word: np.ndarray, k: int) -> np.ndarray:
    return ((word >> np.uint64(8 + 18 * k)) & np.uint64(262143)).astype(np.int64)


def summarise(tls: np.ndarray, packed) -> dict:
    order = np.argsort(packed.instrs["task"])
    sig = packed.instrs["signal"][order]
    names, labels = list(packed.meta["counters"]), list(packed.meta["labels"])
    out = defaultdict(list)
    for raw in tls:
        tl, P = raw[:, :3].astype(np.int64), [phases(raw[:, 3], k) for k in range(3)]
        ready: dict[int, int] = {}
        for t, s in enumerate(sig):
            if s >= 0:
                ready[s] = max(ready.get(s, 0), int(tl[t, 2]))
        for t, label in enumerate(labels):
            m = re.match(r"L(\d+)\.(q|k|v|o)\[|L(\d+)\.attn\.h(\d+)\.b0$", label)
            if not m:
                continue
            if m.group(2):
                layer, kind = m.group(1), m.group(2)
                dep = ready[names.index(f"L{layer}.attn" if kind == "o" else f"x.{layer}")]
            else:
                layer, kind = m.group(3), "partial"
                dep = ready[names.index(f"L{layer}.qkv.h{m.group(4)}")]
            ph = [(tl[t, 1] + P[k][t] - dep) / 1e3 if 0 < P[k][t] < 262143 else np.nan for k in range(3)]
            out[kind].append(ph + [(tl[t, 2] - dep) / 1e3])
    return {k: np.nanmean(np.array(v, float), axis=0).round(2).tolist() for k, v in out.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("specs", nargs="+", help="MODEL:CTX")
    ap.add_argument("--mode", type=int, default=1)
    ap.add_argument("--launches", type=int, default=5)
    a = ap.parse_args()
    defines = {"MVM_PROBE_PARTIAL": a.mode}
    for spec in a.specs:
        model, ctx = spec.split(":")
        vm, packed, w, _, _, verdict = setup(model, int(ctx), defines=defines)
        del vm
        traced = MegakernelVM(packed, w, trace=True, defines=defines)
        tls = []
        for _ in range(a.launches + 1):
            traced.run({"token": 7, "pos": int(ctx)}).wait()
            tls.append(traced.timeline().astype(np.uint64))
        print(model, ctx, verdict["verdict"], "phase 0, 1, 2, end (us):", summarise(np.stack(tls[1:]), packed))


if __name__ == "__main__":
    main()
