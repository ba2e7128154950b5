"""The prior: knobs for a model shape never tuned on this GPU, from the tuned shapes nearest it.

A tuned configuration is kept relative to its own shape's defaults: a tile height or attention split
as its ratio to the default the schedule would pick for that shape (o_rows 2x, kv_block 0.5x), the
other knobs (strategy, lowering variants, build defines) as they are. The K nearest tuned shapes (in
log-scaled size features: width, FFN width, layers, vocabulary, heads, head size, context) vote knob by
knob: a knob leaves its default only where a majority of them moved it the same way (ratios within
25% of each other count as one, their geometric mean is taken), so one shape's noise-level pick does
not travel. The result is applied to the new shape's own defaults and rounded to what the kernel takes.

`python3 -m megavm.flywheel.prior --loo` is the evidence: for each tuned shape on this GPU, the prior
built from the other shapes picks its knobs; that pick, the shape's best tuned configuration and its
defaults are measured in turns, and the table says how far the pick is from the best and from the
defaults.
"""
from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass

from megavm.core.limits import MAX_KV_BLOCK, MAX_TILE_ROWS
from megavm.flywheel.corpus import Corpus, Row, shape_key
from megavm.flywheel.tune import Config
from megavm.schedule.config import ScheduleConfig, resolve
from megavm.schedule.models import ModelConfig

HEIGHTS = ("o_rows", "down_rows", "ffn_rows", "lm_rows", "qkv_rows", "kv_block")
SHAPE_FIELDS = set(ModelConfig.__dataclass_fields__)


def model_of(shape: dict) -> ModelConfig:
    return ModelConfig(**{k: v for k, v in shape.items() if k in SHAPE_FIELDS})


def features(shape: dict, ctx: int) -> list[float]:
    return [math.log2(max(1, v)) for v in (shape["dim"], shape["ffn_dim"], shape["n_layers"], shape["vocab"],
                                            shape["n_heads"], shape["n_kv_heads"], shape["head_dim"], ctx + 64)]


def _defaults(shape: dict, ctx: int, n_sms: int) -> ScheduleConfig:
    return resolve(model_of(shape), ScheduleConfig(dtype=shape.get("dtype", "bf16"), capacity=ctx + 16, n_sms=n_sms))


def relative(row: Row, n_sms: int) -> dict:
    """A tuned row's schedule knobs relative to its shape's defaults (heights as ratios)."""
    d = _defaults(row.shape, row.ctx, n_sms)
    return {k: (("ratio", v / getattr(d, k)) if k in HEIGHTS else ("value", v)) for k, v in row.knobs["schedule"].items()}


def _fit_height(name: str, x: float, cfg: ModelConfig) -> int:
    if name == "qkv_rows":          # an even divisor of head_dim
        ok = [r for r in range(2, cfg.head_dim + 1, 2) if cfg.head_dim % r == 0]
        return min(ok, key=lambda r: (abs(math.log(r / x)), r))
    if name == "kv_block":
        return int(min(MAX_KV_BLOCK, max(16, 16 * round(x / 16))))
    hi = MAX_TILE_ROWS // 2 if name == "ffn_rows" else MAX_TILE_ROWS
    return int(min(hi, max(2, 2 * round(x / 2))))


def apply(rel: dict, shape: dict, ctx: int, n_sms: int, build: dict) -> Config:
    """Relative knobs on a shape's own defaults -> a Config for it (knobs that do not apply dropped)."""
    cfg = model_of(shape)
    d = _defaults(shape, ctx, n_sms)
    sched = {}
    for k, (how, v) in rel.items():
        if k == "split_head_norm" and not cfg.qk_norm:
            continue
        sched[k] = _fit_height(k, getattr(d, k) * v, cfg) if how == "ratio" else v
    return Config.of(sched, build)


K = 3                      # neighbours that vote


@dataclass(frozen=True)
class Pick:
    config: Config
    source: Row            # the nearest tuned configuration
    distance: float
    voters: tuple[str, ...] = ()


def _same(a: tuple, b: tuple) -> bool:
    if a[0] != b[0]:
        return False
    return abs(math.log(a[1] / b[1])) <= math.log(1.25) if a[0] == "ratio" else a[1] == b[1]


def vote(rels: list[dict], quorum: int) -> dict:
    """Knob by knob, the change that at least `quorum` of the relative configurations share."""
    out = {}
    for k in sorted({k for r in rels for k in r}):
        moves = [r[k] for r in rels if k in r]
        for m in moves:
            agree = [x for x in moves if _same(m, x)]
            if len(agree) >= quorum:
                out[k] = (("ratio", math.exp(sum(math.log(x[1]) for x in agree) / len(agree)))
                          if m[0] == "ratio" else m)
                break
    return out


def best_rows(corpus: Corpus, gpu: str, n_sms: int | None = None) -> list[Row]:
    """The best configuration of every (shape, context) tuned on this GPU."""
    keys = {(shape_key(r.shape), r.ctx): r for r in corpus.rows(gpu=gpu) if r.verdict == "PASS"}
    return [corpus.best(r.shape, gpu, ctx) for (_, ctx), r in sorted(keys.items(), key=lambda kv: kv[1].id)]


def prior(shape: dict, ctx: int, gpu: str, corpus: Corpus, n_sms: int, exclude: str | None = None) -> Pick | None:
    """Knobs for `shape` at `ctx` from the K nearest shapes tuned on `gpu` (not the one keyed `exclude`)."""
    f = features(shape, ctx)
    cands = [r for r in best_rows(corpus, gpu) if shape_key(r.shape) != exclude
             and r.shape.get("dtype") == shape.get("dtype")]
    if not cands:
        return None
    dist = lambda r: math.dist(f, features(r.shape, r.ctx))  # noqa: E731
    near = sorted(cands, key=lambda r: (dist(r), r.id))[:K]
    rel = vote([relative(r, n_sms) | {f"build.{b}": ("value", v) for b, v in r.knobs["build"].items()} for r in near],
               quorum=len(near) // 2 + 1)
    build = {k[len("build."):]: v for k, (_, v) in rel.items() if k.startswith("build.")}
    sched = {k: v for k, v in rel.items() if not k.startswith("build.")}
    return Pick(apply(sched, shape, ctx, n_sms, build), near[0], dist(near[0]), tuple(r.model for r in near))


# ---- leave one shape out, on the GPU ----------------------------------------------------------------
def loo(corpus: Corpus, gpu: str, n_sms: int, rounds: int = 3, out=sys.stdout) -> list[dict]:
    import torch

    from megavm.flywheel.tune import gpu_measure
    rows = []
    for best in best_rows(corpus, gpu):
        pick = prior(best.shape, best.ctx, gpu, corpus, n_sms, exclude=shape_key(best.shape))
        if pick is None:
            continue
        cfg = model_of(best.shape)
        base = ScheduleConfig(dtype="bf16", capacity=best.ctx + 16, n_sms=n_sms)
        measure = gpu_measure(cfg, base, best.ctx)
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
    ap.add_argument("--loo", action="store_true", help="measure, for each tuned shape, the pick of the prior "
                                                       "built from the others against its best and its defaults")
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
    command = "python3 -m megavm.flywheel.prior " + " ".join(argv if argv is not None else sys.argv[1:])
    doc = run_doc("prior", command, "leave-one-shape-out: the prior's pick against the best tuned and the defaults",
                  rows=rows)
    print(f"results: {results.write(doc, out_dir(a.out))}")
    return 0 if all(r["verdict"] == "PASS" for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())

