"""The prior: knobs for a model shape never tuned on this GPU, from the tuned shapes nearest it.

A tuned configuration is kept relative to its own shape's defaults: a tile height or attention split
as its ratio to the default the schedule would pick for that shape (o_rows 2x, kv_block 0.5x), the
other knobs (strategy, lowering variants, build defines) as they are. The K nearest tuned shapes (in
log-scaled size features: width, FFN width, layers, vocabulary, heads, head size, context) vote knob by
knob: a knob leaves its default only where a majority of them moved it the same way (ratios within
25% of each other count as one, their geometric mean is taken), so one shape's noise-level pick does
not travel. The result is applied to the new shape's own defaults and rounded to what the kernel takes.

`python3 -m megavm.flywheel.loo` is the evidence (flywheel/loo.py).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

from megavm.core.limits import MAX_KV_BLOCK, MAX_TILE_ROWS
from megavm.flywheel.corpus import Config, Corpus, Row, shape_key, shape_of, unknown_knobs
from megavm.schedule.config import ScheduleConfig, resolve
from megavm.schedule.models import ModelConfig

# knobs carried as their ratio to the shape's default: tile heights, the attention split, the q and kv tile counts
HEIGHTS = ("o_rows", "down_rows", "ffn_rows", "lm_rows", "qkv_rows", "kv_block", "q_tiles", "kv_tiles")
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
    if name in ("q_tiles", "kv_tiles"):     # a count: whole tiles of at least one RoPE pair
        rows = cfg.group * cfg.head_dim if name == "q_tiles" else cfg.head_dim
        return int(min(rows // 2, max(1, round(x))))
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


def best_rows(corpus: Corpus, gpu: str) -> list[Row]:
    """The best configuration of every (shape, context) tuned on this GPU, where its knobs are this
    megavm's."""
    keys = {(shape_key(r.shape), r.ctx): r for r in corpus.rows(gpu=gpu) if r.verdict == "PASS"}
    best = [corpus.best(r.shape, gpu, ctx) for (_, ctx), r in sorted(keys.items(), key=lambda kv: kv[1].id)]
    return [r for r in best if not unknown_knobs(r.knobs)]


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


# ---- the best known configuration, for run and bench ---------------------------------------------
def tuned(cfg: ModelConfig, dtype: str, sc: ScheduleConfig, gpu: str, ctx: int, corpus: Corpus | None = None
          ) -> tuple[ScheduleConfig, dict, str]:
    """(schedule, build defines, what was chosen) from the corpus's best PASS row for this shape and
    dtype on this GPU at the nearest context; for a shape not tuned here, the prior's pick from the
    nearest tuned one (flywheel/prior.py); the defaults (and why) when the corpus has nothing for this
    GPU or the knobs no longer apply."""
    c = corpus or Corpus()
    try:
        row = c.best(shape_of(cfg, dtype), gpu, ctx)
        pick = None if row else prior(shape_of(cfg, dtype), ctx, gpu, c, sc.n_sms)
    finally:
        if corpus is None:
            c.close()
    if row is None and pick is None:
        return sc, {}, f"schedule: defaults (no tuned configuration on {gpu} in {c.path})"
    if row is None:
        return (replace(sc, **dict(pick.config.schedule)), dict(pick.config.build),
                f"schedule: the prior's ({pick.config.describe()}; this shape is not tuned on this GPU; the nearest "
                f"tuned ones: {', '.join(pick.voters)})")
    unknown = unknown_knobs(row.knobs)
    if unknown:
        return sc, {}, f"schedule: defaults (the tuned configuration's knobs {unknown} are not this megavm's)"
    sched, build = row.knobs.get("schedule", {}), row.knobs.get("build", {})
    return (replace(sc, **sched), dict(build),
            f"schedule: tuned on this GPU ({Config.of(sched, build).describe()}; {row.kernel_ms:.3f} ms at ctx "
            f"{row.ctx}, commit {row.commit}, corpus row {row.id})")
