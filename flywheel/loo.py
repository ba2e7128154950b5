"""Leave one shape out: the prior's evidence on this GPU. For each shape tuned here (the corpus's best
configuration of each shape and context), the prior built from the other shapes picks its knobs; that
pick, the shape's best tuned configuration and its defaults are measured in turns (--rounds each), and
the table says how far the pick is from the best and from the defaults (docs/flywheel.md).

  python3 -m megavm.flywheel.loo [--import-json corpus.json] [--rounds 3] [--out DIR]
"""
from __future__ import annotations

import argparse
import sys

from megavm.flywheel.corpus import Config, Corpus, shape_key
from megavm.flywheel.prior import best_rows, model_of, prior
from megavm.schedule.config import ScheduleConfig


def loo(corpus: Corpus, gpu: str, n_sms: int, rounds: int = 3, out=sys.stdout) -> list[dict]:
    import torch

    from megavm.flywheel.tune import GpuMeasure
    rows = []
    for best in best_rows(corpus, gpu):
        pick = prior(best.shape, best.ctx, gpu, corpus, n_sms, exclude=shape_key(best.shape))
        if pick is None:
            continue
        cfg = model_of(best.shape)
        base = ScheduleConfig(dtype="bf16", capacity=best.ctx + 16, n_sms=n_sms)
        measure = GpuMeasure(cfg, base, best.ctx)
        tuned = Config.of(best.knobs["schedule"], best.knobs["build"])
        configs = {"default": Config(), "best": tuned, "prior": pick.config}
        times: dict[str, list[float]] = {k: [] for k in configs}
        verdict = "PASS"
        for _ in range(rounds):
            for k, c in configs.items():
                m = measure(c)
                verdict = verdict if m.verdict == "PASS" else m.verdict
                if m.kernel_ms is not None:
                    times[k].append(m.kernel_ms)
        med = {k: sorted(t)[(len(t) - 1) // 2] if t else float("nan") for k, t in times.items()}
        rows.append(dict(model=best.model, ctx=best.ctx, verdict=verdict, default_ms=med["default"],
                         best_ms=med["best"], prior_ms=med["prior"], prior_from=", ".join(pick.voters),
                         best_knobs=tuned.describe(), prior_knobs=pick.config.describe()))
        r = rows[-1]
        print(f"{r['model']:28s} {r['ctx']:5d} default {r['default_ms']:.3f} best {r['best_ms']:.3f} prior "
              f"{r['prior_ms']:.3f} ({100 * (r['prior_ms'] / r['best_ms'] - 1):+.1f}% of best, from "
              f"{r['prior_from']}: {r['prior_knobs']}) {verdict}", file=out, flush=True)
        del measure
        torch.cuda.empty_cache()
    return rows


def main(argv=None) -> int:
    import torch

    from megavm.flywheel import results
    from megavm.flywheel.bench import out_dir, run_doc
    ap = argparse.ArgumentParser(description="the prior's leave-one-shape-out evidence on this GPU")
    ap.add_argument("--corpus", metavar="FILE", help="the corpus (default: MEGAVM_CACHE_DIR/corpus.sqlite)")
    ap.add_argument("--import-json", metavar="FILE", help="first append an exported corpus")
    ap.add_argument("--rounds", type=int, default=3, help="measurements of each configuration, in turns")
    ap.add_argument("--out", metavar="DIR", help="where the JSON goes (default: $OUT, else the current directory)")
    a = ap.parse_args(argv)
    corpus = Corpus(a.corpus)
    if a.import_json:
        print(f"imported {corpus.import_json(a.import_json)} rows")
    gpu = torch.cuda.get_device_name(0)
    n_sms = torch.cuda.get_device_properties(0).multi_processor_count
    rows = loo(corpus, gpu, n_sms, a.rounds)
    if not rows:
        print("no shapes tuned on this GPU (or only one): nothing to leave out")
        return 1
    within = sum(r["prior_ms"] <= 1.03 * r["best_ms"] for r in rows)
    gain = sum(1 - r["prior_ms"] / r["default_ms"] for r in rows) / len(rows)
    print(f"prior within 3% of the best on {within} of {len(rows)} shapes; on average {100 * gain:+.2f}% under "
          f"the defaults")
    command = "python3 -m megavm.flywheel.loo " + " ".join(argv if argv is not None else sys.argv[1:])
    doc = run_doc("prior", command, "leave-one-shape-out: the prior's pick against the best tuned and the defaults",
                  rows=rows)
    print(f"results: {results.write(doc, out_dir(a.out))}")
    return 0 if all(r["verdict"] == "PASS" for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())

