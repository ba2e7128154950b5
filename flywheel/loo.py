"""Leave one shape out: the prior's evidence on this GPU. For each shape tuned here (the corpus's best
configuration of each shape and context), the prior built from the other shapes picks its knobs; that
pick, the shape's best tuned configuration and its defaults are measured in turns (--rounds each), and
the table says how far the pick is from the best and from the defaults (docs/flywheel.md).

  python3 -m megavm.flywheel.loo [--import-json corpus.json] [--rounds 3] [--shard I/N] [--out DIR]
  python3 -m megavm.flywheel.loo --summary DOC [DOC ...]

On a host of several GPUs of one kind, the shapes can be left out in parallel: process I of N, on GPU I, takes
the tuned shapes I, I + N, ... (--shard I/N; the prior still votes from every other shape), and --summary adds
up the run docs the shards wrote (docs/flywheel.md).
"""
from __future__ import annotations

import argparse
import json
import sys

from megavm.flywheel.corpus import Config, Corpus, shape_key
from megavm.flywheel.prior import best_rows, model_of, prior
from megavm.flywheel.results import prior_evidence
from megavm.schedule.config import ScheduleConfig


def held_out(corpus: Corpus, gpu: str, shard: tuple[int, int] = (0, 1)) -> list:
    """The tuned shapes (their best rows) that shard (I, N) leaves out in turn: I, I + N, ... of them."""
    i, n = shard
    return best_rows(corpus, gpu)[i::n]


def row_line(r: dict) -> str:
    """One left-out shape: its three times, how far the pick is from the best, and where the pick came from."""
    return (f"{r['model']:28s} {r['ctx']:5d} default {r['default_ms']:.3f} best {r['best_ms']:.3f} prior "
            f"{r['prior_ms']:.3f} ({100 * (r['prior_ms'] / r['best_ms'] - 1):+.1f}% of best, from "
            f"{r['prior_from']}: {r['prior_knobs']}) {r['verdict']}")


def summary(rows: list[dict]) -> str:
    """The evidence's two numbers over rows: shapes whose pick is within 3% of the best, and the pick's mean
    gain over the defaults."""
    within, gain = prior_evidence(rows)
    return f"prior within 3% of the best on {within} of {len(rows)} shapes; on average {100 * gain:+.2f}% under the defaults"


def loo(corpus: Corpus, gpu: str, n_sms: int, rounds: int = 3, out=sys.stdout,
        shard: tuple[int, int] = (0, 1)) -> list[dict]:
    import torch

    from megavm.flywheel.tune import GpuMeasure
    rows = []
    for best in held_out(corpus, gpu, shard):
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
        print(row_line(rows[-1]), file=out, flush=True)
        del measure
        torch.cuda.empty_cache()
    return rows


def summarize(paths: list[str], out=None) -> int:
    """The rows of the leave-one-out run docs at paths, shape by shape, and the two numbers over all of them;
    2 (one line on stderr) for a file that is not such a doc."""
    out = out or sys.stdout
    rows = []
    for p in paths:
        try:
            doc = json.loads(open(p).read())
        except (OSError, ValueError) as e:
            print(f"loo: {p}: not readable as JSON ({e})", file=sys.stderr)
            return 2
        if not isinstance(doc, dict) or doc.get("kind") != "prior" or not isinstance(doc.get("rows"), list):
            print(f"loo: {p}: not a leave-one-out run doc (kind 'prior')", file=sys.stderr)
            return 2
        rows += doc["rows"]
    if not rows:
        print("loo: the docs hold no shapes", file=sys.stderr)
        return 2
    for r in rows:
        print(row_line(r), file=out)
    print(summary(rows), file=out)
    return 0 if all(r["verdict"] == "PASS" for r in rows) else 1


def parse_shard(text: str) -> tuple[int, int]:
    """'I/N' as (I, N), 0 <= I < N; ValueError otherwise."""
    i, sep, n = text.partition("/")
    if not sep or not i.isdigit() or not n.isdigit() or not 0 <= int(i) < int(n):
        raise ValueError(f"--shard {text}: expected I/N with 0 <= I < N (2/4, say)")
    return int(i), int(n)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="the prior's leave-one-shape-out evidence on this GPU")
    ap.add_argument("--corpus", metavar="FILE", help="the corpus (default: MEGAVM_CACHE_DIR/corpus.sqlite)")
    ap.add_argument("--import-json", metavar="FILE", help="first append an exported corpus")
    ap.add_argument("--rounds", type=int, default=3, help="measurements of each configuration, in turns")
    ap.add_argument("--out", metavar="DIR", help="where the JSON goes (default: $OUT, else the current directory)")
    ap.add_argument("--shard", metavar="I/N", help="leave out only tuned shapes I, I + N, ... (one process a GPU)")
    ap.add_argument("--summary", nargs="+", metavar="DOC", help="add up leave-one-out run docs (no GPU)")
    a = ap.parse_args(argv)
    if a.summary:
        return summarize(a.summary)
    try:
        shard = parse_shard(a.shard) if a.shard else (0, 1)
    except ValueError as e:
        print(f"loo: {e}", file=sys.stderr)
        return 2
    import torch

    from megavm.flywheel import results
    from megavm.flywheel.bench import out_dir, run_doc
    corpus = Corpus(a.corpus)
    if a.import_json:
        print(f"imported {corpus.import_json(a.import_json)} rows")
    gpu = torch.cuda.get_device_name(0)
    n_sms = torch.cuda.get_device_properties(0).multi_processor_count
    rows = loo(corpus, gpu, n_sms, a.rounds, shard=shard)
    if not rows:
        print("no shapes tuned on this GPU (or only one, or none in this shard): nothing to leave out")
        return 1
    print(summary(rows) + (f" (shard {shard[0]}/{shard[1]})" if a.shard else ""))
    command = "python3 -m megavm.flywheel.loo " + " ".join(argv if argv is not None else sys.argv[1:])
    doc = run_doc("prior", command, "leave-one-shape-out: the prior's pick against the best tuned and the defaults",
                  rows=rows)
    print(f"results: {results.write(doc, out_dir(a.out))}")
    return 0 if all(r["verdict"] == "PASS" for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())

