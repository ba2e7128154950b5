"""Measured runs under bench/results: one JSON object per run, one schema per kind, and the generated index.

    python3 -m megavm.flywheel.results index [--dir DIR]   rewrite DIR/README.md from the run files
    python3 -m megavm.flywheel.results check [--dir DIR]   validate every run file; exit 1 listing problems

Measurement tools call write(doc, out_dir); it validates the doc, names the file and writes it atomically.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import sys
import tempfile
from pathlib import Path

RESULTS_DIR = Path(__file__).resolve().parent.parent / "bench" / "results"
SCHEMA_VERSION = 1
DEFAULT_CTX = 128  # the bench's default context; the index names other contexts
NUM = (int, float)
REQ, OPT = True, False

# field -> (allowed types, required); every kind starts with COMMON
COMMON: dict[str, tuple[tuple[type, ...], bool]] = {
    "kind": ((str,), REQ), "schema": ((int,), REQ), "device": ((str,), REQ), "date": ((str,), REQ),
    "commit": ((str,), REQ), "command": ((str,), REQ), "note": ((str,), REQ),
}
SCHEMAS: dict[str, dict] = {
    "bench": {
        "about": "`megavm bench`: megavm against eager, CUDA graph and torch.compile, with verdicts",
        "fields": {"torch": ((str,), OPT), "copy_GBps": (NUM, REQ), "rows": ((list,), REQ)},
        "rows": {"model": ((str,), REQ), "ctx": ((int,), REQ), "GB": (NUM, REQ), "floor_ms": (NUM, REQ),
                 "tasks": ((int,), REQ), "verdict": ((str,), REQ), "max_rel_err": (NUM, REQ),
                 "megavm_ms": (NUM, REQ), "megavm_e2e_ms": (NUM, REQ), "eager_ms": (NUM, REQ),
                 "cudagraph_ms": (NUM, REQ), "compiled_ms": (NUM, OPT), "compile_s": (NUM, OPT),
                 "compiled_error": ((str,), OPT), "compile_setup": ((str,), OPT), "schedule": ((str,), OPT),
                 "build": ((str,), OPT)},
    },
    "bench_dlrm": {
        "about": "`megavm bench` on DLRM presets: megavm against the torch DLRM eager, in a CUDA graph and compiled",
        "fields": {"torch": ((str,), OPT), "copy_GBps": (NUM, REQ), "rows": ((list,), REQ)},
        "rows": {"model": ((str,), REQ), "batch": ((int,), REQ), "GB": (NUM, REQ), "floor_ms": (NUM, REQ),
                 "tasks": ((int,), REQ), "verdict": ((str,), REQ), "max_abs_err": (NUM, REQ),
                 "megavm_ms": (NUM, REQ), "megavm_run_ms": (NUM, REQ), "eager_ms": (NUM, REQ),
                 "cudagraph_ms": (NUM, REQ), "compiled_ms": (NUM, OPT), "compile_s": (NUM, OPT),
                 "compiled_error": ((str,), OPT)},
    },
    "kernel_time": {
        "about": "`python3 -m megavm.flywheel.kernel_time`: kernel-only time per variant, ablation A/B rows, passes",
        "fields": {"rows": ((list,), REQ), "numbers": ((dict,), OPT)},
        "rows": {"model": ((str,), REQ), "ctx": ((int,), REQ), "ablations": ((str,), REQ),
                 "verdict": ((str,), REQ), "kernel_ms": (NUM, REQ), "rel_err": (NUM, OPT),
                 "generate_ms": (NUM, OPT), "GBps": (NUM, OPT), "GB": (NUM, OPT), "pass": ((int,), OPT),
                 "chain_tasks": ((int,), OPT), "queues": ((int,), OPT), "build": ((str,), OPT)},
    },
    "gpu_tests": {
        "about": "`pytest -m cuda tests/gpu`: pass counts",
        "fields": {"passed": ((int,), REQ), "failed": ((int,), REQ), "skipped": ((int,), REQ),
                   "deselected": ((int,), OPT), "selection": ((str,), OPT), "failures": ((list,), OPT),
                   "duration_s": (NUM, OPT)},
    },
    "trace": {
        "about": "`megavm trace`: per-opcode wait/run and per-stage times of one launch",
        "fields": {"model": ((str,), REQ), "ctx": ((int,), REQ), "span_us": (NUM, OPT), "blocks": ((int,), OPT),
                   "run_fraction": (NUM, OPT), "ops": ((dict,), OPT), "stages": ((dict,), OPT)},
        "ops": {"tasks": ((int,), REQ), "wait_us": (NUM, REQ), "run_us": (NUM, REQ), "GBps_per_sm": (NUM, REQ)},
        "stages": {"count": ((int,), REQ), "mean_us": (NUM, REQ), "max_us": (NUM, REQ), "tail_us": (NUM, OPT),
                   "sm_tail_us": (NUM, OPT)},
    },
    "tune": {
        "about": "`megavm tune`: every configuration measured for one model shape, and the one kept",
        "fields": {"model": ((str,), REQ), "ctx": ((int,), REQ), "best": ((str,), REQ), "rows": ((list,), REQ)},
        "rows": {"knobs": ((str,), REQ), "verdict": ((str,), REQ), "kernel_ms": (NUM, OPT), "rel_err": (NUM, OPT),
                 "detail": ((str,), OPT)},
    },
    "prior": {
        "about": "`python3 -m megavm.flywheel.loo`: leave-one-shape-out, the prior's pick against the best "
                 "tuned configuration and the defaults",
        "fields": {"rows": ((list,), REQ)},
        "rows": {"model": ((str,), REQ), "ctx": ((int,), REQ), "verdict": ((str,), REQ), "default_ms": (NUM, REQ),
                 "best_ms": (NUM, REQ), "prior_ms": (NUM, REQ), "prior_from": ((str,), REQ),
                 "best_knobs": ((str,), REQ), "prior_knobs": ((str,), REQ)},
    },
    "probe": {
        "about": "research instruments (loader, chain, GEMV, L2 probes ...): named numbers, units in the keys",
        "fields": {"name": ((str,), REQ), "numbers": ((dict,), REQ)},
    },
}
VERDICTS = ("PASS", "FAIL", "ERROR")         # ERROR: a tuned configuration that did not build or run
TRACE_PARTS = ("span_us", "blocks", "run_fraction", "ops", "stages")


def _type_ok(value, types: tuple[type, ...]) -> bool:
    # bool is an int to Python, never to a schema
    return isinstance(value, types) and not (isinstance(value, bool) and bool not in types)


def _check_fields(obj: dict, spec: dict, where: str) -> list[str]:
    problems = []
    for field, (types, required) in spec.items():
        if field not in obj:
            if required:
                problems.append(f"{where}: missing '{field}'")
        elif not _type_ok(obj[field], types):
            want = "/".join(t.__name__ for t in types)
            problems.append(f"{where}: '{field}' is {type(obj[field]).__name__}, not {want}")
    return problems


def _check_rows(doc: dict, kind: str) -> list[str]:
    rows = doc.get("rows")
    if not isinstance(rows, list):
        return []
    if not rows:
        return [f"{kind}: 'rows' is empty"]
    problems = []
    for i, row in enumerate(rows):
        where = f"{kind} row {i}"
        if not isinstance(row, dict):
            problems.append(f"{where}: not an object")
            continue
        problems += _check_fields(row, SCHEMAS[kind]["rows"], where)
        if "verdict" in row and row["verdict"] not in VERDICTS:
            problems.append(f"{where}: 'verdict' is {row['verdict']!r}, not PASS or FAIL")
    return problems


def _check_table(table, spec: dict, where: str) -> list[str]:
    if not isinstance(table, dict):
        return []
    problems = []
    for name, entry in table.items():
        if isinstance(entry, dict):
            problems += _check_fields(entry, spec, f"{where} '{name}'")
        else:
            problems.append(f"{where} '{name}': not an object")
    return problems


def _numbers_only(value, where: str) -> list[str]:
    # a probe's numbers: numbers, or lists/objects of them, nested
    if _type_ok(value, NUM):
        return []
    if isinstance(value, list):
        return [p for i, v in enumerate(value) for p in _numbers_only(v, f"{where}[{i}]")]
    if isinstance(value, dict):
        return [p for k, v in value.items() for p in _numbers_only(v, f"{where}.{k}")]
    return [f"{where}: {type(value).__name__} is not a number"]


def _check_kind(doc: dict, kind: str) -> list[str]:
    problems = _check_fields(doc, SCHEMAS[kind]["fields"], kind) + _check_rows(doc, kind)
    if kind == "trace":
        problems += _check_table(doc.get("ops"), SCHEMAS["trace"]["ops"], "trace op")
        problems += _check_table(doc.get("stages"), SCHEMAS["trace"]["stages"], "trace stage")
        if not any(k in doc for k in TRACE_PARTS):
            problems.append(f"trace: none of {', '.join(TRACE_PARTS)}")
    if isinstance(doc.get("numbers"), dict):
        problems += _numbers_only(doc["numbers"], f"{kind} numbers")
    if kind == "gpu_tests" and isinstance(doc.get("failures"), list):
        problems += [f"gpu_tests: failure {i} is not a string" for i, f in enumerate(doc["failures"])
                     if not isinstance(f, str)]
    return problems


def _is_date(text: str) -> bool:
    try:
        return bool(re.fullmatch(r"\d{4}-\d{2}-\d{2}", text)) and bool(datetime.date.fromisoformat(text))
    except ValueError:
        return False


def validate(doc) -> list[str]:
    """Problems with one run doc, each naming its field; empty when the doc fits its kind's schema."""
    if not isinstance(doc, dict):
        return [f"run: a {type(doc).__name__}, not an object"]
    problems = _check_fields(doc, COMMON, "run")
    kind = doc.get("kind")
    if isinstance(kind, str) and kind not in SCHEMAS:
        problems.append(f"run: 'kind' is {kind!r}, not one of {', '.join(SCHEMAS)}")
    if "schema" in doc and doc["schema"] != SCHEMA_VERSION:
        problems.append(f"run: 'schema' is {doc['schema']!r}, not {SCHEMA_VERSION}")
    if isinstance(doc.get("date"), str) and not _is_date(doc["date"]):
        problems.append(f"run: 'date' is {doc['date']!r}, not YYYY-MM-DD")
    for field in ("commit", "device", "note"):
        if isinstance(doc.get(field), str) and not doc[field].strip():
            problems.append(f"run: '{field}' is empty")
    if kind in SCHEMAS:
        problems += _check_kind(doc, kind)
    return problems


def _slugify(text: str) -> str:
    return re.sub(r"-+", "-", re.sub(r"[^a-z0-9-]", "-", text.lower())).strip("-")


def default_slug(doc: dict) -> str:
    """The file's slug when the doc names none: its models in row order, else its model or probe name."""
    models = list(dict.fromkeys(r.get("model", "") for r in doc.get("rows", []) if isinstance(r, dict)))
    return _slugify("-".join(models) or doc.get("model") or doc.get("name") or doc["kind"]) or doc["kind"]


def file_name(doc: dict, slug: str) -> str:
    """<date>-<commit without spaces>-<slug>.json; characters a path cannot hold become '-'."""
    commit = re.sub(r"[^A-Za-z0-9._+=-]", "-", doc["commit"].replace(" ", ""))
    return f"{doc['date']}-{commit}-{_slugify(slug)}.json"


def dumps(doc: dict) -> str:
    return json.dumps(doc, indent=1, allow_nan=False) + "\n"


def write(doc: dict, out_dir) -> Path:
    """Validate `doc`, write it to out_dir/<kind>/<name>.json atomically and return the path.

    An optional doc["slug"] names the file (it is not stored); without it the slug comes from the models.
    A name already taken gets -2, -3, ... so that no run overwrites another."""
    doc = dict(doc)
    slug = doc.pop("slug", None)
    problems = validate(doc)
    if problems:
        raise ValueError("invalid run: " + "; ".join(problems))
    folder = Path(out_dir) / doc["kind"]
    folder.mkdir(parents=True, exist_ok=True)
    base = file_name(doc, slug or default_slug(doc))[:-len(".json")]
    path, n = folder / f"{base}.json", 1
    while path.exists():
        n += 1
        path = folder / f"{base}-{n}.json"
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tmp-", suffix=".json")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(dumps(doc))
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def run_files(results_dir) -> list[Path]:
    """Every run file: results_dir/<kind>/*.json, sorted."""
    root = Path(results_dir)
    return sorted(p for kind in SCHEMAS for p in (root / kind).glob("*.json"))


def load(path: Path) -> dict:
    return json.loads(Path(path).read_text())


def short_device(name: str) -> str:
    """'NVIDIA H100 80GB HBM3' -> 'H100'."""
    words = [w for w in name.split() if w not in ("NVIDIA", "GeForce", "Tesla")]
    if len(words) > 1 and words[0] in ("RTX", "GTX"):
        return " ".join(words[:2])
    return words[0] if words else name


def _model_ctx(row: dict) -> str:
    return row["model"] + ("" if row["ctx"] == DEFAULT_CTX else f" ctx {row['ctx']}")


def _bench_headline(doc: dict) -> str:
    return "; ".join(f"{_model_ctx(r)} {r['megavm_ms']:.3f} ms {r['verdict']}" for r in doc["rows"])


def _kernel_time_headline(doc: dict) -> str:
    base: dict[str, list[str]] = {}
    for r in doc["rows"]:
        if r["ablations"] == "baseline":
            fail = "" if r["verdict"] == "PASS" else " FAIL"
            base.setdefault(_model_ctx(r), []).append(f"{r['kernel_ms']:.3f}{fail}")
    parts = [f"{k} {' / '.join(v)} ms" for k, v in base.items()]
    ablated = sum(r["ablations"] != "baseline" for r in doc["rows"])
    if ablated:
        parts.append(f"{ablated} ablation rows")
    return "; ".join(parts)


def _gpu_tests_headline(doc: dict) -> str:
    text = f"{doc['passed']} passed" + "".join(f", {doc[k]} {k}" for k in ("failed", "skipped") if doc[k])
    return text + (f" (-k {doc['selection']})" if doc.get("selection") else "")


def _trace_headline(doc: dict) -> str:
    what = _model_ctx(doc)
    if "span_us" in doc:
        return f"{what} span {doc['span_us']:.1f} us"
    return f"{what} stages only"


def _bench_dlrm_headline(doc: dict) -> str:
    return "; ".join(f"{r['model']} batch {r['batch']} {r['megavm_ms']:.4f} ms {r['verdict']}" for r in doc["rows"])


def _tune_headline(doc: dict) -> str:
    ok = [r for r in doc["rows"] if r["verdict"] == "PASS"]
    default = [r["kernel_ms"] for r in ok if r["knobs"] == "defaults"]
    return (f"{_model_ctx(doc)}: {len(doc['rows'])} configurations ({len(ok)} PASS), defaults "
            f"{min(default):.3f} ms, kept: {doc['best']}" if default else f"{_model_ctx(doc)}: kept {doc['best']}")


def prior_evidence(rows: list[dict]) -> tuple[int, float]:
    """Leave-one-out rows' two numbers: the shapes whose prior pick is within 3% of their best tuned time, and
    the pick's mean gain over the defaults (a fraction)."""
    within = sum(r["prior_ms"] <= 1.03 * r["best_ms"] for r in rows)
    return within, sum(1 - r["prior_ms"] / r["default_ms"] for r in rows) / len(rows)


def _prior_headline(doc: dict) -> str:
    rows = doc["rows"]
    within, gain = prior_evidence(rows)
    return f"leave one out on {len(rows)} shapes: prior within 3% of the best on {within}, {100 * gain:+.2f}% vs defaults"


HEADLINES = {"bench": _bench_headline, "bench_dlrm": _bench_dlrm_headline, "kernel_time": _kernel_time_headline,
             "gpu_tests": _gpu_tests_headline, "trace": _trace_headline, "tune": _tune_headline,
             "prior": _prior_headline, "probe": lambda doc: doc["name"]}


def headline(doc: dict) -> str:
    return HEADLINES[doc["kind"]](doc).replace("|", "/")


def _fields_cell(spec: dict) -> str:
    return ", ".join(f"`{k}`" + ("" if req else "?") for k, (_, req) in spec.items())


def _kinds_table() -> list[str]:
    out = ["| kind | what | fields (? optional) | per row / entry |", "|---|---|---|---|"]
    for kind, s in SCHEMAS.items():
        nested = "; ".join(f"{part}: {_fields_cell(s[part])}" for part in ("rows", "ops", "stages") if part in s)
        out.append(f"| `{kind}` | {s['about']} | {_fields_cell(s['fields'])} | {nested} |")
    return out


HEADER = """# bench/results: measured runs

Every run measured on a GPU is one JSON file, `<kind>/<date>-<commit>-<slug>.json`, in the schema of its kind
(`flywheel/results.py`). Common fields:
{common}.
`commit` names the code measured, with any define or work in progress beside it (`6dc6631 -DMVM_PREFETCH_TABLES=0`,
`d88d84f+wip`); `note` says what the run was for, what it was compared with and whether the change was kept.
Raw logs are not kept here; git history has the earlier ones.
"""
USAGE = """Tools write runs with `flywheel.results.write(doc, out_dir)`: it validates the doc, names the file and writes
it atomically. `python3 -m megavm.flywheel.results check` validates every file. After adding or changing runs,
regenerate this index with `python3 -m megavm.flywheel.results index` (the tests compare the two). Runs a
device call brought back (a folder, or the archive `flywheel/gpu_check.sh` and `flywheel/ab.sh` leave in `$OUT`)
are filed with `python3 -m megavm.flywheel.file_runs SRC [--commit C] [--slug S]`, which also rewrites it.
"""


def index(results_dir) -> str:
    """The README.md text for results_dir: the kinds, then every run by date, kind and file."""
    root = Path(results_dir)
    runs = []
    for path in run_files(root):
        doc, rel = load(path), path.relative_to(root).as_posix()
        problems = validate(doc)
        if problems:
            raise ValueError(f"{rel}: {'; '.join(problems)}")
        runs.append((doc["date"], doc["kind"], rel, doc))
    runs.sort(key=lambda r: r[:3])
    out = [HEADER.format(common=", ".join(f"`{k}`" for k in COMMON)), *_kinds_table(), "", USAGE,
           f"## Runs ({len(runs)})", "",
           "| date | device | kind | commit | headline | file |", "|---|---|---|---|---|---|"]
    for date, kind, rel, doc in runs:
        commit = doc["commit"].replace("|", "/")
        out.append(f"| {date} | {short_device(doc['device'])} | {kind} | `{commit}` | {headline(doc)} "
                   f"| [{Path(rel).name}]({rel}) |")
    return "\n".join(out) + "\n"


def check(results_dir) -> list[str]:
    """Problems with every run file (named by path) and with the index; empty when all is well."""
    root = Path(results_dir)
    files, problems = run_files(root), []
    known = set(files)
    for path in files:
        rel = path.relative_to(root).as_posix()
        try:
            doc = load(path)
        except (OSError, ValueError) as e:
            problems.append(f"{rel}: not JSON ({e})")
            continue
        problems += [f"{rel}: {p}" for p in validate(doc)]
        if isinstance(doc, dict) and doc.get("kind") != path.parent.name:
            problems.append(f"{rel}: kind {doc.get('kind')!r} in folder {path.parent.name!r}")
    stray = sorted(p.relative_to(root).as_posix() for p in root.rglob("*")
                   if p.is_file() and p != root / "README.md" and p not in known)
    problems += [f"{s}: not a run file (<kind>/*.json)" for s in stray]
    readme = root / "README.md"
    if not problems and (not readme.exists() or readme.read_text() != index(root)):
        problems.append("README.md: stale; run python3 -m megavm.flywheel.results index")
    return problems


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python3 -m megavm.flywheel.results", description=__doc__.split("\n")[0])
    ap.add_argument("command", choices=("index", "check"))
    ap.add_argument("--dir", type=Path, default=RESULTS_DIR, help="the results folder (default: bench/results)")
    a = ap.parse_args(argv)
    if a.command == "index":
        try:
            text = index(a.dir)
        except ValueError as e:
            print(f"not indexed: {e}", file=sys.stderr)
            return 1
        (a.dir / "README.md").write_text(text)
        print(f"wrote {a.dir / 'README.md'} ({len(run_files(a.dir))} runs)")
        return 0
    problems = check(a.dir)
    for p in problems:
        print(p, file=sys.stderr)
    print(f"{len(run_files(a.dir))} runs, {len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
