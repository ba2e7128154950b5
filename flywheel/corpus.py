"""The tuning corpus: every configuration `megavm tune` measured, in one SQLite file under the cache
directory (MEGAVM_CACHE_DIR/corpus.sqlite), appendable from many runs and machines and exportable as
JSON. A row is one measurement: the model's shape (its ModelConfig, keyed by a hash of it), the context
it decoded at, the GPU, the knobs (ScheduleConfig fields and build defines that differ from the
defaults), the kernel time, the verdict against the eager model, and the commit.

`best(shape, gpu, ctx)` is what `megavm run` and `megavm bench` consult: the PASS configuration with
the fastest median for that shape on that GPU, at the nearest context measured (within the noise, the
one nearest the defaults).
"""
from __future__ import annotations

import hashlib
import json
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path

from megavm.core.errors import UserError
from megavm.core.limits import KNOBS
from megavm.schedule.config import ScheduleConfig
from megavm.schedule.models import ModelConfig
from megavm.vm import env

SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    id INTEGER PRIMARY KEY,
    uid TEXT UNIQUE NOT NULL,          -- content hash: the same measurement imported twice is one row
    shape_key TEXT NOT NULL,
    model TEXT NOT NULL,               -- the preset or checkpoint it was measured as (a label)
    shape TEXT NOT NULL,               -- ModelConfig.to_dict() as JSON
    gpu TEXT NOT NULL,
    ctx INTEGER NOT NULL,
    knobs TEXT NOT NULL,               -- {"schedule": {...}, "build": {...}}: what differs from the defaults
    kernel_ms REAL,                    -- NULL when the configuration failed to build or run
    verdict TEXT NOT NULL,             -- PASS, FAIL, or ERROR
    rel_err REAL,
    detail TEXT NOT NULL DEFAULT '',   -- the error of an ERROR row
    commit_id TEXT NOT NULL,
    date TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS runs_lookup ON runs (shape_key, gpu, ctx);
"""
COLUMNS = ("uid", "shape_key", "model", "shape", "gpu", "ctx", "knobs", "kernel_ms", "verdict", "rel_err", "detail",
           "commit_id", "date")


def shape_key(shape: dict) -> str:
    """A model shape's key: the hash of its config (every field that changes the program)."""
    return hashlib.sha256(json.dumps(shape, sort_keys=True).encode()).hexdigest()[:16]


def default_path() -> Path:
    return env.cache_dir() / "corpus.sqlite"


@dataclass(frozen=True)
class Row:
    model: str
    shape: dict
    gpu: str
    ctx: int
    knobs: dict
    kernel_ms: float | None
    verdict: str
    rel_err: float | None = None
    detail: str = ""
    commit: str = "unknown"
    date: str = ""
    id: int | None = None

    def record(self) -> tuple:
        date = self.date or time.strftime("%Y-%m-%d")
        fields = dict(shape_key=shape_key(self.shape), model=self.model, shape=json.dumps(self.shape, sort_keys=True),
                      gpu=self.gpu, ctx=int(self.ctx), knobs=json.dumps(self.knobs, sort_keys=True),
                      kernel_ms=self.kernel_ms, verdict=self.verdict, rel_err=self.rel_err, detail=self.detail,
                      commit_id=self.commit, date=date)
        uid = hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:24]
        return (uid,) + tuple(fields[c] for c in COLUMNS[1:])

    def to_dict(self) -> dict:
        return dict(model=self.model, shape=self.shape, gpu=self.gpu, ctx=self.ctx, knobs=self.knobs,
                    kernel_ms=self.kernel_ms, verdict=self.verdict, rel_err=self.rel_err, detail=self.detail,
                    commit=self.commit, date=self.date)


def _row(r: sqlite3.Row) -> Row:
    return Row(model=r["model"], shape=json.loads(r["shape"]), gpu=r["gpu"], ctx=r["ctx"], knobs=json.loads(r["knobs"]),
               kernel_ms=r["kernel_ms"], verdict=r["verdict"], rel_err=r["rel_err"], detail=r["detail"],
               commit=r["commit_id"], date=r["date"], id=r["id"])


class Corpus:
    """The corpus at `path` (default: MEGAVM_CACHE_DIR/corpus.sqlite), created on first use."""

    def __init__(self, path: Path | str | None = None):
        self.path = Path(path) if path else default_path()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self.db = sqlite3.connect(self.path)
            self.db.row_factory = sqlite3.Row
            self.db.executescript(SCHEMA)
        except sqlite3.DatabaseError as e:
            raise UserError(f"{self.path}: not a megavm corpus ({e})") from None

    def close(self) -> None:
        self.db.close()

    def __enter__(self) -> "Corpus":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def add(self, row: Row) -> bool:
        """Append one measurement; False when the very same row is already there."""
        with self.db:
            cur = self.db.execute(f"INSERT OR IGNORE INTO runs ({', '.join(COLUMNS)}) VALUES "
                                  f"({', '.join('?' * len(COLUMNS))})", row.record())
        return cur.rowcount == 1

    def rows(self, shape: dict | None = None, gpu: str | None = None, ctx: int | None = None) -> list[Row]:
        where, args = [], []
        for col, v in (("shape_key", shape and shape_key(shape)), ("gpu", gpu), ("ctx", ctx)):
            if v is not None:
                where.append(f"{col} = ?")
                args.append(v)
        q = "SELECT * FROM runs" + (" WHERE " + " AND ".join(where) if where else "") + " ORDER BY id"
        return [_row(r) for r in self.db.execute(q, args)]

    def best(self, shape: dict, gpu: str, ctx: int, noise: float = 0.005) -> Row | None:
        """The best PASS configuration for this shape on this GPU, at the measured context nearest ctx:
        each configuration's median over its measurements, the fastest, and among those within `noise`
        of it the one that changes the fewest knobs (a difference under the noise is no reason to
        leave the defaults). Returns that configuration's median row."""
        ctxs = [r[0] for r in self.db.execute("SELECT DISTINCT ctx FROM runs WHERE shape_key = ? AND gpu = ? AND "
                                              "verdict = 'PASS'", (shape_key(shape), gpu))]
        if not ctxs:
            return None
        near = min(ctxs, key=lambda c: (abs(c - ctx), c))
        by_knobs: dict[str, list[Row]] = {}
        for r in self.db.execute("SELECT * FROM runs WHERE shape_key = ? AND gpu = ? AND ctx = ? AND verdict = 'PASS' "
                                 "ORDER BY id", (shape_key(shape), gpu, near)):
            by_knobs.setdefault(r["knobs"], []).append(_row(r))
        medians = [sorted(rs, key=lambda r: r.kernel_ms)[(len(rs) - 1) // 2] for rs in by_knobs.values()]
        fastest = min(r.kernel_ms for r in medians)
        near_best = [r for r in medians if r.kernel_ms <= fastest * (1 + noise)]
        return min(near_best, key=lambda r: (sum(len(v) for v in r.knobs.values()), r.kernel_ms, r.id))

    def export_json(self, path: Path | str) -> int:
        rows = [r.to_dict() for r in self.rows()]
        Path(path).write_text(json.dumps({"kind": "megavm-corpus", "schema": 1, "rows": rows}, indent=1) + "\n")
        return len(rows)

    def import_json(self, path: Path | str) -> int:
        """Append the rows of an exported corpus (another machine's); returns how many were new."""
        try:
            doc = json.loads(Path(path).read_text())
        except json.JSONDecodeError as e:
            raise UserError(f"{path}: not JSON ({e})") from None
        if not isinstance(doc, dict) or doc.get("kind") != "megavm-corpus" or not isinstance(doc.get("rows"), list):
            raise UserError(f"{path}: not an exported megavm corpus (expected kind 'megavm-corpus' with rows)")
        new = 0
        for i, d in enumerate(doc["rows"]):
            try:
                new += self.add(Row(**d))
            except TypeError as e:
                raise UserError(f"{path}: row {i}: {e}") from None
        return new


# ---- what a row's knobs and shape are ------------------------------------------------------------
SCHEDULE_DEFAULTS = ScheduleConfig()
BUILD_DEFAULTS = {k.name: k.value for k in KNOBS}          # the build knobs of core/limits.py


def unknown_knobs(knobs: dict) -> list[str]:
    """The knobs of a row (another version's, say) that this megavm's ScheduleConfig and build lack."""
    return ([k for k in knobs.get("schedule", {}) if not hasattr(SCHEDULE_DEFAULTS, k)]
            + [k for k in knobs.get("build", {}) if k not in BUILD_DEFAULTS])


@dataclass(frozen=True)
class Config:
    """One point of the search: ScheduleConfig changes and build defines, both as differences from the
    defaults (what the corpus stores as knobs)."""
    schedule: tuple = ()        # sorted (field, value) pairs
    build: tuple = ()

    @staticmethod
    def of(schedule: dict, build: dict) -> "Config":
        schedule = {k: _frozen(v) for k, v in schedule.items()}
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
        parts = [f"{k}=fitted({len(v)} rows)" if k == "cost" else f"{k}={v}" for k, v in self.schedule + self.build]
        return ", ".join(parts) or "defaults"


def shape_of(cfg: ModelConfig, dtype: str) -> dict:
    """What the corpus keys a measurement by: the model's config and the weights' dtype."""
    return dict(cfg.to_dict(), dtype=dtype)


def _frozen(v):
    """JSON's lists as tuples (a knob value must hash: the cost model's table is a list of lists)."""
    return tuple(_frozen(x) for x in v) if isinstance(v, (list, tuple)) else v
