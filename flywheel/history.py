"""How one model's step time moved across commits, from the run files under bench/results: every PASS
baseline row of `megavm bench` (bf16 weights and KV cache) and of kernel_time, per device, in commit
order, each commit's fastest run against the fastest of every earlier commit on that device. A commit
more than --drift percent slower than that is marked.

    python3 -m megavm.flywheel.history --model llama-1b [--ctx 128] [--device H200] [--drift 5] [--dir DIR]

A/B runs compare two trees inside one call, so a change that slows both sides is invisible to them: the
kernel from 31dc187 to 99a5105 ran 10% slower on every model and no A/B showed it (docs/performance.md,
session 56). This view across calls shows such a step. Machines of one kind differ by a few percent, so
a mark asks for a check in one call (the old commit's tree beside the new one), not a verdict.
"""
from __future__ import annotations

import argparse
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from megavm.flywheel import results

REPO = Path(__file__).resolve().parent.parent


@dataclass
class Point:
    """One commit's PASS baselines on one device."""
    commit: str
    date: str
    ms: list[float] = field(default_factory=list)


def commit_order(repo: Path = REPO) -> dict[str, int]:
    """Full hash -> position in the history of every ref (oldest first); empty without git."""
    try:
        out = subprocess.run(["git", "-C", str(repo), "rev-list", "--all", "--topo-order", "--reverse"],
                             capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return {}
    return {h: i for i, h in enumerate(out.split())}


def _position(label: str, order: dict[str, int]) -> float | None:
    """A run's commit label ('abc1234', 'abc1234+wip-x': a working tree on top of abc1234) -> its place."""
    base = label.split("+")[0].removesuffix("-dirty")
    hits = [i for h, i in order.items() if base and h.startswith(base)] if len(base) >= 7 else []
    if len(hits) != 1:
        return None
    return hits[0] + (0.5 if "+" in label or label.endswith("-dirty") else 0.0)


def baselines(docs: list[dict], model: str, ctx: int) -> dict[str, dict[str, Point]]:
    """device -> commit label -> its PASS baseline times of model at ctx (bf16 weights and cache)."""
    out: dict[str, dict[str, Point]] = {}
    for doc in docs:
        kind = doc.get("kind")
        for row in doc.get("rows", []) if kind in ("bench", "kernel_time") else []:
            if row.get("model") != model or row.get("ctx") != ctx or row.get("verdict") != "PASS":
                continue
            if kind == "bench":
                if row.get("weights", "bf16") != "bf16" or row.get("kv_cache", "bf16") != "bf16":
                    continue
                ms = row.get("megavm_ms")
            else:
                if row.get("ablations") != "baseline":
                    continue
                ms = row.get("kernel_ms")
            p = out.setdefault(doc["device"], {}).setdefault(doc["commit"], Point(doc["commit"], doc["date"]))
            p.ms.append(float(ms))
            p.date = min(p.date, doc["date"])
    return out


def ordered(points: dict[str, Point], order: dict[str, int]) -> list[Point]:
    """Commit order where git knows the commit; a commit it does not know (a branch since deleted) goes
    after the known ones first measured on or before its date."""
    known = {c: _position(c, order) for c in points}
    latest: dict[str, float] = {}
    for c, pos in known.items():
        if pos is not None:
            d = points[c].date
            latest[d] = max(latest.get(d, -1.0), pos)
    def key(p: Point) -> tuple[float, str]:
        pos = known[p.commit]
        if pos is None:
            before = [v for d, v in latest.items() if d <= p.date]
            pos = (max(before) if before else -1.0) + 0.75
        return (pos, p.date)
    return sorted(points.values(), key=key)


def drift_table(points: list[Point], drift: float) -> list[tuple[Point, float | None, str | None, bool]]:
    """(point, best ms of the earlier commits, which commit, marked) in order."""
    rows, best, best_at = [], None, None
    for p in points:
        fastest = min(p.ms)
        marked = best is not None and fastest > best * (1 + drift / 100)
        rows.append((p, best, best_at, marked))
        if best is None or fastest < best:
            best, best_at = fastest, p.commit
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python3 -m megavm.flywheel.history", description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--ctx", type=int, default=results.DEFAULT_CTX)
    ap.add_argument("--device", default="", help="only devices whose name holds this (e.g. H200)")
    ap.add_argument("--drift", type=float, default=5.0, help="mark a commit this many percent over the best before it")
    ap.add_argument("--dir", default=str(results.RESULTS_DIR))
    args = ap.parse_args(argv)
    if args.drift < 0:
        print("history: --drift must not be negative", file=sys.stderr)
        return 2
    docs = [results.load(f) for f in results.run_files(args.dir)]
    by_device = {d: v for d, v in baselines(docs, args.model, args.ctx).items() if args.device in d}
    if not by_device:
        print(f"history: no PASS baseline of {args.model} at ctx {args.ctx}"
              + (f" on a device named like {args.device!r}" if args.device else "") + f" under {args.dir}",
              file=sys.stderr)
        return 1
    order = commit_order()
    for device, points in sorted(by_device.items()):
        print(f"\n{device} · {args.model} · ctx {args.ctx}")
        print(f"{'commit':28s} {'date':10s} {'runs':>4s} {'ms':>13s}  {'best before':>19s}  change")
        for p, best, at, marked in drift_table(ordered(points, order), args.drift):
            lo, hi = min(p.ms), max(p.ms)
            span = f"{lo:.3f}" if hi - lo < 5e-4 else f"{lo:.3f}-{hi:.3f}"
            before = f"{best:.3f} ({at[:9]})" if best is not None else "-"
            change = f"{100 * (lo / best - 1):+.1f}%" if best is not None else ""
            print(f"{p.commit[:28]:28s} {p.date:10s} {len(p.ms):4d} {span:>13s}  {before:>19s}  {change}"
                  + (f"  slower than {at[:9]} by more than {args.drift:g}%" if marked else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
