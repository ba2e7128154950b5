"""`megavm tune`: search the schedule's knobs for one model shape on this GPU and record every
configuration measured in the corpus (flywheel/corpus.py).

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

import argparse
import sys
import time
from dataclasses import dataclass, fields, replace
from typing import Callable

import torch

from megavm.core.errors import RunError, UserError
from megavm.core.limits import MAX_KV_BLOCK, MAX_TILE_ROWS
from megavm.flywheel.corpus import Corpus, Row
from megavm.schedule.config import ScheduleConfig, resolve
from megavm.schedule.models import ModelConfig

NOISE = 0.005                   # a value must beat the best by more than this fraction to be kept
CONFIRM = 3                     # more measurements each of the best and the defaults at the end
SCHEDULE_DEFAULTS = ScheduleConfig()
BUILD_DEFAULTS = {"MVM_STAGES": 10, "MVM_INFLIGHT": 2}


@dataclass(frozen=True)
class Config:
    """One point of the search: ScheduleConfig changes and build defines, both as differences from the
    defaults (what the corpus stores as knobs)."""
    schedule: tuple = ()        # sorted (field, value) pairs
    build: tuple = ()

    @staticmethod
    def of(schedule: dict, build: dict) -> "Config":
        s = {k: v for k, v in schedule.items() if getattr(SCHEDULE_DEFAULTS, k) != v}
        b = {k: v for k, v in build.items() if BUILD_DEFAULTS[k] != v}
        return Config(tuple(sorted(s.items())), tuple(sorted(b.items())))

    def knobs(self) -> dict:
        return {"schedule": dict(self.schedule), "build": dict(self.build)}

    def with_knob(self, kind: str, name: str, value) -> "Config":
        s, b = dict(self.schedule), dict(self.build)
        (s if kind == "schedule" else b)[name] = value
        return Config.of(s, b)

    def describe(self) -> str:
        parts = [f"{k}={v}" for k, v in self.schedule + self.build]
        return ", ".join(parts) or "defaults"


def _around(v: int, lo: int, hi: int, step: int = 2) -> list[int]:
    """Halved and doubled tile heights around a default, rounded to `step`, within [lo, hi]."""
    out = []
    for x in (v // 2, v * 2):
        x = max(lo, min(hi, x - x % step))
        if x != v and x not in out:
            out.append(x)
    return out


def knob_values(cfg: ModelConfig, lc: ScheduleConfig) -> list[tuple[str, str, list]]:
    """(kind, name, values to try besides the current) for each knob of this shape; lc is resolved."""
    hd = cfg.head_dim
    qkv = sorted({r for r in (hd // 4, hd // 2, hd) if r >= 2 and r % 2 == 0 and hd % r == 0} - {lc.qkv_rows})
    kv_blocks = sorted({b for b in (lc.kv_block // 2, lc.kv_block * 2)
                        if 16 <= b <= MAX_KV_BLOCK and b % 16 == 0 and b != lc.kv_block})
    out = [("schedule", "o_rows", _around(lc.o_rows, 2, MAX_TILE_ROWS)),
           ("schedule", "down_rows", _around(lc.down_rows, 2, MAX_TILE_ROWS)),
           ("schedule", "ffn_rows", _around(lc.ffn_rows, 2, MAX_TILE_ROWS // 2)),
           ("schedule", "lm_rows", _around(lc.lm_rows, 2, MAX_TILE_ROWS)),
           ("schedule", "qkv_rows", qkv),
           ("schedule", "kv_block", kv_blocks),
           ("schedule", "strategy", ["round_robin"]),
           ("schedule", "fuse_combine", [True]),
           ("schedule", "head_counters", [False]),
           ("build", "MVM_INFLIGHT", [1, 3]),
           ("build", "MVM_STAGES", [8])]
    if cfg.qk_norm:
        out.append(("schedule", "split_head_norm", [False]))
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
           passes: int = 2) -> tuple[Measurement, list[Measurement]]:
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
        for kind, name, values in knob_values(cfg, lc):
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
def gpu_measure(cfg: ModelConfig, base: ScheduleConfig, ctx: int, seed: int = 0) -> Callable[[Config], Measurement]:
    """A measure function for `search`: one step checked against the eager model, then the median
    kernel-only time (relaunch)."""
    from megavm.core.errors import MegavmError
    from megavm.flywheel.timing import median_ms
    from megavm.schedule.eager import EagerDecoder
    from megavm.schedule.weights import program_weights, random_hf_weights
    from megavm.vm.compile import compile
    from megavm.vm.megakernel import MegakernelVM
    from megavm.vm.verify import VS_EAGER

    hf = random_hf_weights(cfg, torch.bfloat16, seed=seed, device="cuda")
    w = program_weights(cfg, hf)
    ref = EagerDecoder(cfg, hf, base.capacity).step(7, ctx)
    want = int(ref.argmax())
    tol = VS_EAGER["bf16"].value

    def measure(c: Config) -> Measurement:
        try:
            packed = compile(cfg, replace(base, **dict(c.schedule)))
            vm = MegakernelVM(packed, w, defines=dict(c.build) or None)
            res = vm.run({"token": 7, "pos": ctx})
            err = ((res.logits - ref).abs().max() / ref.abs().max()).item()
            verdict = "PASS" if res.token == want and err <= tol else "FAIL"
            ms = median_ms(vm.relaunch, iters=100, warmup=10)
            del vm
            return Measurement(c, ms, verdict, err)
        except (MegavmError, ValueError) as e:        # a configuration this shape cannot take
            return Measurement(c, None, "ERROR", detail=f"{type(e).__name__}: {str(e)[:300]}")

    return measure


def setup_tune(p: argparse.ArgumentParser) -> None:
    from megavm.args import count
    from megavm.schedule.models import PRESETS
    p.add_argument("--model", choices=sorted(PRESETS), help="model preset")
    p.add_argument("--checkpoint", metavar="DIR", help="a local Hugging Face folder: its config's shape is tuned, on "
                                                        "seeded random weights (overrides --model)")
    p.add_argument("--ctx", type=count(0), default=128, help="context length the step decodes at (default: 128)")
    p.add_argument("--budget", type=count(1), default=600, metavar="SECONDS",
                   help="time for the search, builds included (default: 600)")
    p.add_argument("--corpus", metavar="FILE", help="the corpus (default: MEGAVM_CACHE_DIR/corpus.sqlite)")
    p.add_argument("--export", metavar="FILE", help="also write the whole corpus as JSON")
    p.add_argument("--confirm", type=count(0), default=CONFIRM, metavar="N",
                   help=f"measure the best and the defaults N more times each at the end (default: {CONFIRM})")
    p.add_argument("--out", metavar="DIR", help="also record the run under DIR/tune/ (bench/results layout)")


def cmd_tune(a: argparse.Namespace) -> int:
    """Search the schedule's knobs for a model on this GPU; record every configuration in the corpus."""
    from megavm.flywheel.bench import commit
    from megavm.schedule.checkpoint import read_config
    from megavm.schedule.models import preset
    if not a.model and not a.checkpoint:
        raise UserError("name a model: --model NAME or --checkpoint DIR")
    if not torch.cuda.is_available():
        raise UserError("needs an NVIDIA GPU (torch.cuda.is_available() is False)")
    cfg = read_config(a.checkpoint) if a.checkpoint else preset(a.model)
    label = a.checkpoint or a.model
    gpu = torch.cuda.get_device_name(0)
    n_sms = torch.cuda.get_device_properties(0).multi_processor_count
    base = ScheduleConfig(dtype="bf16", capacity=a.ctx + 16, n_sms=n_sms)
    corpus = Corpus(a.corpus)
    rev = commit()
    print(f"tuning {label} at ctx {a.ctx} on {gpu} for {a.budget} s; corpus {corpus.path}")

    def record(m: Measurement) -> None:
        corpus.add(Row(model=label, shape=shape_of(cfg, "bf16"), gpu=gpu, ctx=a.ctx, knobs=m.config.knobs(),
                       kernel_ms=m.kernel_ms, verdict=m.verdict, rel_err=m.rel_err, detail=m.detail, commit=rev))

    measure = gpu_measure(cfg, base, a.ctx)
    best, seen = search(cfg, base, measure, a.budget, record)
    print(f"{len(seen)} configurations measured ({sum(m.verdict == 'PASS' for m in seen)} PASS); confirming")
    times = {best.config: [best.kernel_ms], Config(): [seen[0].kernel_ms]}
    for _ in range(a.confirm if best.config != Config() else 0):
        for c in (Config(), best.config):
            m = measure(c)
            record(m)
            if m.verdict != "PASS":
                raise RunError(f"{c.describe()} passed once and then failed ({m.verdict}: {m.detail or m.rel_err})")
            times[c].append(m.kernel_ms)
    med = {c: sorted(t)[(len(t) - 1) // 2] for c, t in times.items()}
    print(f"defaults: {med[Config()]:.3f} ms PASS (median of {len(times[Config()])})")
    if best.config != Config():
        print(f"best:     {med[best.config]:.3f} ms PASS (median of {len(times[best.config])}; "
              f"{best.config.describe()}), {100 * (1 - med[best.config] / med[Config()]):.1f}% under the defaults")
    row = corpus.best(shape_of(cfg, "bf16"), gpu, a.ctx, NOISE)
    print(f"run and bench will use: {Config.of(row.knobs['schedule'], row.knobs['build']).describe()} "
          f"({row.kernel_ms:.3f} ms, the median of its measurements in the corpus)")
    if a.export:
        print(f"exported {corpus.export_json(a.export)} rows to {a.export}")
    if a.out:
        from pathlib import Path

        from megavm.flywheel import results
        from megavm.flywheel.bench import run_doc
        doc = run_doc("tune", "megavm tune " + " ".join(sys.argv[2:]), f"tuned for {a.budget} s", model=label,
                      ctx=a.ctx, best=Config.of(row.knobs["schedule"], row.knobs["build"]).describe(),
                      rows=[{k: v for k, v in (("knobs", m.config.describe()), ("verdict", m.verdict),
                                               ("kernel_ms", m.kernel_ms), ("rel_err", m.rel_err), ("detail", m.detail))
                             if v not in (None, "")} for m in seen])
        print(f"results: {results.write(doc, Path(a.out))}")
    corpus.close()
    return 0


# ---- the best known configuration, for run and bench ----------------------------------------------
def shape_of(cfg: ModelConfig, dtype: str) -> dict:
    """What the corpus keys a measurement by: the model's config and the weights' dtype."""
    return dict(cfg.to_dict(), dtype=dtype)


def tuned(cfg: ModelConfig, dtype: str, sc: ScheduleConfig, gpu: str, ctx: int, corpus: Corpus | None = None
          ) -> tuple[ScheduleConfig, dict, str]:
    """(schedule, build defines, what was chosen) from the corpus's best PASS row for this shape and
    dtype on this GPU at the nearest context; for a shape not tuned here, the prior's pick from the
    nearest tuned one (flywheel/prior.py); the defaults (and why) when the corpus has nothing for this
    GPU or the knobs no longer apply."""
    own = corpus is None
    corpus = corpus or Corpus()
    try:
        row = corpus.best(shape_of(cfg, dtype), gpu, ctx)
    finally:
        if own:
            corpus.close()
    if row is None:
        from megavm.flywheel.prior import prior
        with Corpus(corpus.path) as c:
            pick = prior(shape_of(cfg, dtype), ctx, gpu, c, sc.n_sms)
        if pick is None:
            return sc, {}, f"schedule: defaults (no tuned configuration on {gpu} in {corpus.path})"
        return (replace(sc, **dict(pick.config.schedule)), dict(pick.config.build),
                f"schedule: the prior's ({pick.config.describe()}; this shape is not tuned on this GPU; the nearest "
                f"tuned ones: {', '.join(pick.voters)})")
    names = {f.name for f in fields(ScheduleConfig)}
    sched, build = row.knobs.get("schedule", {}), row.knobs.get("build", {})
    unknown = [k for k in sched if k not in names] + [k for k in build if k not in BUILD_DEFAULTS]
    if unknown:
        return sc, {}, f"schedule: defaults (the tuned configuration's knobs {unknown} are not this megavm's)"
    picked = Config.of(sched, build)
    return (replace(sc, **sched), dict(build),
            f"schedule: tuned on this GPU ({picked.describe()}; {row.kernel_ms:.3f} ms at ctx {row.ctx}, commit "
            f"{row.commit}, corpus row {row.id})")
