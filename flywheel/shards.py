"""Run a pytest selection in several processes at once and add up what they report. Each shard collects
the whole selection and keeps every N-th test, in collection order (this module is also the pytest plugin that
does it: `-p megavm.flywheel.shards --megavm-shard I/N`). Shard i runs on GPU i % G of the G GPUs
`nvidia-smi -L` lists (where it lists none, CUDA_VISIBLE_DEVICES is left as it is).

    python3 -m megavm.flywheel.shards --shards 8 [--timeout 540] [--log-dir DIR] [-x] -- -m cuda tests/gpu/test_megakernel.py

What follows `--` is the selection, pytest's arguments (files, -m, -k). The shards run it with
`-q -rs -p no:cacheprovider` (and -x with -x). Each shard's output goes to DIR/shard-I.log, and the last
line printed adds up the shards' counts, as pytest's own last line does.

Most of the time of megavm's GPU tests goes to ReferenceVM on the CPU. On an H200 host, test_megakernel.py's
slowest attention tests take 18-24 s each, so one process cannot finish that file in a 10-minute device call.
Eight processes at once on one GPU ran the rest of test_megakernel.py and all of test_moe.py (73 tests) in one
device call of 245 s, the builds compiled first (session 60, with a script that dealt the tests the same way;
bench/results/gpu_tests/2026-11-28-4e16f52-megakernel-rest-and-moe).
flywheel/gpu_check.sh uses this with SHARDS=N.
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

COUNTS = ("passed", "failed", "errors", "skipped", "deselected")
TOTALS = ("passed", "failed", "errors", "skipped")   # what the shards add up to (each deselects the others' tests)


@pytest.hookimpl(trylast=True)                   # after -m and -k have deselected theirs
def pytest_collection_modifyitems(config, items):
    """--megavm-shard I/N: keep collected tests I, I + N, I + 2N, ...; deselect the rest."""
    v = config.getoption("megavm_shard", None)
    if not v:
        return
    i, n = (int(x) for x in v.split("/"))
    drop = [it for k, it in enumerate(items) if k % n != i]
    items[:] = items[i::n]
    if drop:
        config.hook.pytest_deselected(items=drop)


def pytest_addoption(parser):
    parser.addoption("--megavm-shard", dest="megavm_shard", default=None, metavar="I/N",
                     help="keep the collected tests I, I + N, ... (flywheel/shards.py)")


def collect(selection: list[str]) -> int:
    """How many tests pytest collects for `selection`. ValueError, naming pytest's last line, where
    collection fails."""
    r = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *selection],
                       capture_output=True, text=True)
    if r.returncode not in (0, 5):               # 5: nothing collected
        last = (r.stdout.strip().splitlines() or r.stderr.strip().splitlines() or ["no output"])[-1]
        raise ValueError(f"pytest could not collect {' '.join(selection)}: {last}")
    return sum(1 for line in r.stdout.splitlines() if "::" in line and not line.startswith(" "))


def counts(text: str) -> dict[str, int]:
    """The counts of pytest's summary line in text ("3 passed, 1 failed, 2 warnings in 4.2s"): passed, failed,
    errors (pytest's "error" and "errors"), skipped, deselected; 0 for each it does not name."""
    out = dict.fromkeys(COUNTS, 0)
    lines = [ln for ln in text.splitlines() if re.search(r"\d+ (passed|failed|errors?|skipped|deselected)\b", ln)]
    if lines:
        for n, word in re.findall(r"(\d+) (passed|failed|errors?|skipped|deselected)\b", lines[-1]):
            out["errors" if word.startswith("error") else word] += int(n)
    return out


def gpu_count() -> int:
    """GPUs nvidia-smi lists (0 without nvidia-smi or a driver)."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return 0
    r = subprocess.run([smi, "-L"], capture_output=True, text=True)
    return sum(1 for line in r.stdout.splitlines() if line.startswith("GPU ")) if r.returncode == 0 else 0


def run(selection: list[str], n: int, log_dir: Path, timeout: float, stop_first: bool = False,
        gpus: int | None = None) -> tuple[list[int], list[dict[str, int]]]:
    """The selection in n pytest processes at once, shard i keeping collected tests i, i + n, ...; (exit
    codes, counts) by shard. A shard still running after `timeout` seconds gets SIGINT (pytest then
    reports what ran), and is killed 30 s later; its code is then 124."""
    gpus = gpu_count() if gpus is None else gpus
    log_dir.mkdir(parents=True, exist_ok=True)
    procs = []
    for i in range(n):
        env = dict(os.environ)
        if gpus:
            env["CUDA_VISIBLE_DEVICES"] = str(i % gpus)
        log = open(log_dir / f"shard-{i}.log", "w")
        cmd = [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", "-p", "megavm.flywheel.shards",
               f"--megavm-shard={i}/{n}", *(["-x"] if stop_first else []), *selection]
        procs.append((subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env), log))
    end = time.monotonic() + timeout
    codes = []
    for p, log in procs:
        try:
            codes.append(p.wait(timeout=max(0.0, end - time.monotonic())))
        except subprocess.TimeoutExpired:
            p.send_signal(signal.SIGINT)
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
            codes.append(124)
        log.close()
    return codes, [counts((log_dir / f"shard-{i}.log").read_text()) for i in range(n)]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="run a pytest selection in N processes at once, spread over the GPUs")
    ap.add_argument("--shards", type=int, default=4, metavar="N", help="processes (default 4)")
    ap.add_argument("--timeout", type=float, default=540.0, metavar="S", help="wall seconds for every shard (default 540)")
    ap.add_argument("--log-dir", type=Path, default=Path(os.environ.get("OUT", "/tmp/megavm-gpu")) / "shards",
                    metavar="DIR", help="where shard-I.log go (default $OUT/shards)")
    ap.add_argument("-x", dest="stop_first", action="store_true", help="each shard stops at its first failure")
    ap.add_argument("selection", nargs="+", help="pytest's collection arguments, after --")
    args = ap.parse_args(argv)
    if args.shards < 1:
        print(f"shards: --shards {args.shards}: must be at least 1", file=sys.stderr)
        return 2
    t0 = time.monotonic()
    try:
        total_ids = collect(args.selection)
    except ValueError as e:
        print(f"shards: {e}", file=sys.stderr)
        return 2
    if not total_ids:
        print(f"shards: no tests collected for {' '.join(args.selection)}")
        return 5
    n = min(args.shards, total_ids)
    codes, per = run(args.selection, n, args.log_dir, args.timeout, args.stop_first)
    for i, (code, c) in enumerate(zip(codes, per)):
        got = ", ".join(f"{c[k]} {k}" for k in TOTALS if c[k]) or "nothing reported"
        print(f"shard {i}: {got}, exit {code} ({args.log_dir / f'shard-{i}.log'})")
    total = {k: sum(c[k] for c in per) for k in TOTALS}
    missing = total_ids - sum(total.values())
    words = [f"{total[k]} {k}" for k in TOTALS if total[k]] + ([f"{missing} not run"] if missing > 0 else [])
    print(f"{', '.join(words) or 'nothing run'} in {time.monotonic() - t0:.1f}s ({n} shards of {total_ids} tests)")
    return 0 if all(code == 0 for code in codes) and missing <= 0 else 1


if __name__ == "__main__":
    sys.exit(main())
