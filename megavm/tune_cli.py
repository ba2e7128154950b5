"""`megavm tune`: the command around flywheel/tune.py's search, recording into the corpus."""
from __future__ import annotations

import argparse
import sys

import torch

from megavm.args import count
from megavm.core.errors import RunError, UserError
from megavm.flywheel.corpus import Config, Corpus, Row, shape_of
from megavm.flywheel.tune import CONFIRM, NOISE, GpuMeasure, Measurement, search
from megavm.schedule.config import ScheduleConfig


def setup_tune(p: argparse.ArgumentParser) -> None:
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

    measure = GpuMeasure(cfg, base, a.ctx)
    fitted = measure.fit_cost()
    print(f"cost model fitted on a traced launch: {len(fitted) - 1} opcodes, hand-off {fitted[-1][1] / 1e3:.2f} us")
    best, seen = search(cfg, base, measure, a.budget, record, fitted=fitted)
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
