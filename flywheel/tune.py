"""The search behind `megavm tune` (megavm/tune_cli.py): the schedule's knobs for one model shape on
this GPU, every configuration measured going to the corpus (flywheel/corpus.py).

The knobs are the ones a decode step's time answers to: tile heights of the o, gate/up, down and LM
head projections and of the q/k/v tiles, the attention split (keys per partial), the SM assignment
strategy, the lowering variants (combine fused into the o-projection, per-head counters, the head-norm
split), and two build knobs (ring stages, weight copies in flight), each a separate build of the
megakernel. The search is coordinate descent from the defaults: each knob's values are tried with the
others at their best so far, and a value is kept when it passes (one step against the eager model:
token identical, logits within the bf16 tolerance) and is faster by more than the noise (0.5%). It
stops when the time budget cannot fit another measurement. Then the best and the defaults are measured
again, in turns (CONFIRM times each, outside the budget): one measurement can be off by 2%, and the
corpus's choice (Corpus.best) is the configuration with the fastest median. Weights are seeded random
ones of the model's shape: the time depends on the shape, not the values.
"""
from __future__ import annotations

import sys
import time
from dataclasses import dataclass, replace
from typing import Callable

import torch

from megavm.core.errors import UserError
from megavm.core.limits import MAX_KV_BLOCK, MAX_TILE_ROWS
from megavm.flywheel.corpus import Config
from megavm.schedule.assign import STRATEGIES
from megavm.schedule.config import ScheduleConfig, one_block, resolve, split_head_norm
from megavm.schedule.fit import fit_chain
from megavm.schedule.models import ModelConfig

NOISE = 0.005                   # a value must beat the best by more than this fraction to be kept
CONFIRM = 3                     # more measurements each of the best and the defaults at the end


def _around(v: int, lo: int, hi: int, step: int = 2, ratios: tuple[float, ...] = (0.5, 2)) -> list[int]:
    """Tile heights or counts around a default (halved and doubled, or the given ratios), rounded down to
    `step`, within [lo, hi]."""
    out = []
    for r in ratios:
        x = int(v * r)
        x = max(lo, min(hi, x - x % step))
        if x != v and x not in out:
            out.append(x)
    return out


def _fits_otherwise(cfg: ModelConfig, lc: ScheduleConfig) -> bool:
    """Whether fit_chain would pick other q/k/v tile counts than lc's defaults (else trying it is a rerun)."""
    got = fit_chain(cfg, replace(lc, q_tiles=0, kv_tiles=0, qkv_rows=0, fit_chain=True))
    return (got.q_tiles, got.kv_tiles) != (lc.q_tiles, lc.kv_tiles)


def knob_values(cfg: ModelConfig, lc: ScheduleConfig, fitted: tuple = ()) -> list[tuple[str, str, list]]:
    """(kind, name, values to try besides the current) for each knob of this shape; lc is resolved;
    fitted: a cost model fitted on a traced run of this shape (flywheel/costfit.py), tried for the
    balanced assignment."""
    hd = cfg.head_dim
    counts = not cfg.qk_norm or split_head_norm(cfg, lc)     # else whole-head tiles: the counts are fixed
    qkv = sorted({r for r in (hd // 4, hd // 2, hd) if r >= 2 and r % 2 == 0 and hd % r == 0} - {lc.qkv_rows})
    one = one_block(lc.capacity)                              # one block a KV head (attn_direct)
    kv_blocks = sorted({b for b in (lc.kv_block // 2, lc.kv_block * 2, one)
                        if 16 <= b <= MAX_KV_BLOCK and b % 16 == 0 and b != lc.kv_block and b <= one})
    out = [("schedule", "o_rows", _around(lc.o_rows, 2, MAX_TILE_ROWS)),
           ("schedule", "down_rows", _around(lc.down_rows, 2, MAX_TILE_ROWS)),
           ("schedule", "ffn_rows", _around(lc.ffn_rows, 2, MAX_TILE_ROWS // 2)),
           ("schedule", "lm_rows", _around(lc.lm_rows, 2, MAX_TILE_ROWS)),
           ("schedule", "qkv_rows", qkv),
           # q tiles also a quarter either way: session 46 found llama-1b's best at 8 against the default 6
           ("schedule", "q_tiles", _around(lc.q_tiles, 1, cfg.group * hd // 2, step=1, ratios=(0.5, 0.75, 4 / 3, 2))
            if counts else []),
           # one fewer too: at 2 or 3 tiles a KV head halving skips the count that frees the SMs a layer's
           # partials need (schedule.assign.crowded_partials)
           ("schedule", "kv_tiles", sorted({max(1, min(hd // 2, x)) for x in (lc.kv_tiles // 2, lc.kv_tiles - 1,
                                                                              lc.kv_tiles * 2)} - {lc.kv_tiles})
            if counts else []),
           ("schedule", "kv_block", kv_blocks),
           ("schedule", "combine_q_heads", sorted({q for q in (1, 2, 4, cfg.group) if q <= cfg.group}
                                                  - {lc.combine_q_heads})),
           ("schedule", "strategy", sorted(set(STRATEGIES) - {lc.strategy})),
           ("schedule", "fit_chain", [True] if counts and _fits_otherwise(cfg, lc) else []),
           ("schedule", "attn_direct", [False] if lc.kv_block >= lc.capacity else []),
           ("schedule", "fuse_combine", [True]),
           ("schedule", "head_counters", [False]),
           ("schedule", "q_counter", [not lc.q_counter]),
           ("build", "MVM_INFLIGHT", [1, 3]),
           # the LM head's copies in flight: 3 and 4 measured alike on an H200 (docs/performance.md, session 59)
           ("build", "MVM_LAST_INFLIGHT", [2, 4]),
           ("build", "MVM_STAGES", [8])]
    # the 4-bit tensor-core GEMVs' fewest tile rows: NVFP4's on e4m3 (96 by default: off, or every tile) and
    # int4's on the integer cores (32 by default: 96, as before session 66, or every tile); and int4's down
    # projections on the integer cores with B in x's place (32 by default: off, or every tile; llama-1b's 16-row
    # down tiles lost there in session 64; docs/quantization.md)
    if lc.weights == "nvfp4":
        out.append(("build", "MVM_E2M1_F8", [0, 1]))
    if lc.weights == "int4":
        out.append(("build", "MVM_U4_IMMA", [96, 1]))
        out.append(("build", "MVM_U4_IMMA_LONG", [0, 1]))
    if cfg.qk_norm:
        out.append(("schedule", "split_head_norm", [False]))
    if fitted and lc.cost != fitted and lc.strategy == "balanced":     # round robin reads no costs
        out.append(("schedule", "cost", [fitted]))
    return [(k, n, v) for k, n, v in out if v]


@dataclass
class Measurement:
    config: Config
    kernel_ms: float | None
    verdict: str
    rel_err: float | None = None
    detail: str = ""
    seconds: float = 0.0


class Progress:
    """One status line on a terminal (redrawn), one line per measurement otherwise."""

    def __init__(self, budget_s: float, stream=None):
        self.t0, self.budget, self.n = time.monotonic(), budget_s, 0
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()

    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    def show(self, m: Measurement, best: Measurement | None) -> None:
        self.n += 1
        frac = min(1.0, self.elapsed() / self.budget) if self.budget > 0 else 1.0
        bar = "#" * int(20 * frac) + "." * (20 - int(20 * frac))
        got = f"{m.kernel_ms:.3f} ms {m.verdict}" if m.kernel_ms is not None else m.verdict
        best_s = f"best {best.kernel_ms:.3f} ms" if best and best.kernel_ms is not None else "no PASS yet"
        line = (f"[{bar}] {self.elapsed():4.0f}/{self.budget:.0f} s  #{self.n} {m.config.describe()}: {got}; "
                f"{best_s}")
        if self.tty:
            self.stream.write("\r\x1b[K" + line[:200])
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def done(self) -> None:
        if self.tty:
            self.stream.write("\n")


def search(cfg: ModelConfig, base: ScheduleConfig, measure: Callable[[Config], Measurement], budget_s: float,
           record: Callable[[Measurement], None] = lambda m: None, progress: Progress | None = None,
           passes: int = 2, fitted: tuple = ()) -> tuple[Measurement, list[Measurement]]:
    """Coordinate descent over knob_values from the defaults within budget_s seconds (the defaults are
    always measured). Returns (best PASS measurement, every measurement)."""
    progress = progress or Progress(budget_s)
    seen: dict[Config, Measurement] = {}
    last = [0.0]

    def run(c: Config) -> Measurement:
        if c not in seen:
            t = time.monotonic()
            m = measure(c)
            m.seconds = time.monotonic() - t
            last[0] = max(last[0] * 0.5, m.seconds)
            seen[c] = m
            record(m)
            progress.show(m, best)
        return seen[c]

    best = None
    best = run(Config())
    if best.verdict != "PASS":
        progress.done()
        raise UserError(f"the default configuration does not pass ({best.verdict}: {best.detail or best.rel_err})")
    for _ in range(passes):
        improved = False
        lc = resolve(cfg, replace(base, **dict(best.config.schedule)))
        for kind, name, values in knob_values(cfg, lc, fitted):
            for v in values:
                if progress.elapsed() + last[0] > budget_s:
                    progress.done()
                    return best, list(seen.values())
                m = run(best.config.with_knob(kind, name, v))
                if m.verdict == "PASS" and m.kernel_ms < best.kernel_ms * (1 - NOISE):
                    best, improved = m, True
        if not improved:
            break
    progress.done()
    return best, list(seen.values())


# ---- on the GPU --------------------------------------------------------------------------------
class GpuMeasure:
    """measure(config) for `search`: one step checked against the eager model (the token identical,
    logits within the bf16 tolerance), then the median kernel-only time (relaunch). Weights are seeded
    random ones of the shape, made once."""

    def __init__(self, cfg: ModelConfig, base: ScheduleConfig, ctx: int, seed: int = 0):
        from megavm.schedule.eager import EagerDecoder
        from megavm.schedule.weights import program_weights, random_hf_weights
        self.cfg, self.base, self.ctx = cfg, base, ctx
        hf = random_hf_weights(cfg, torch.bfloat16, seed=seed, device="cuda")
        self.w = program_weights(cfg, hf)
        self.ref = EagerDecoder(cfg, hf, base.capacity).step(7, ctx)
        self.want = int(self.ref.argmax())

    def __call__(self, c: Config) -> Measurement:
        from megavm.core.errors import MegavmError
        from megavm.flywheel.timing import median_ms
        from megavm.vm.compile import compile
        from megavm.vm.megakernel import MegakernelVM
        from megavm.vm.verify import VS_EAGER
        try:
            packed = compile(self.cfg, replace(self.base, **dict(c.schedule)))
            vm = MegakernelVM(packed, self.w, defines=dict(c.build) or None)
            res = vm.run({"token": 7, "pos": self.ctx})
            err = ((res.logits - self.ref).abs().max() / self.ref.abs().max()).item()
            verdict = "PASS" if res.token == self.want and err <= VS_EAGER["bf16"].value else "FAIL"
            ms = median_ms(vm.relaunch, iters=100, warmup=10)
            del vm
            return Measurement(c, ms, verdict, err)
        except (MegavmError, ValueError) as e:        # a configuration this shape cannot take
            return Measurement(c, None, "ERROR", detail=f"{type(e).__name__}: {str(e)[:300]}")

    def fit_cost(self) -> tuple:
        """The cost model fitted on a traced launch of the defaults (flywheel/costfit.py)."""
        from megavm.flywheel.costfit import fit
        from megavm.schedule.plan import plan
        from megavm.vm.megakernel import MegakernelVM
        from megavm.vm.pack import pack
        p = plan(self.cfg, self.base).checked()
        vm = MegakernelVM(pack(p.program, p.queues), self.w, trace=True)
        for _ in range(3):
            vm.run({"token": 7, "pos": self.ctx}).wait()
        return fit(p.program, vm.timeline())
