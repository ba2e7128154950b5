"""File the run docs a device call brought back under bench/results, and rewrite the index.

    python3 -m megavm.flywheel.file_runs SRC [--commit C] [--slug S] [--dir DIR]

SRC is a folder or a tar archive (`flywheel/gpu_check.sh` and `flywheel/ab.sh` leave their docs in
`$OUT/results*.tgz`: a device call brings back 8 files). --commit relabels runs measured on a tree that
was committed after they ran; --slug says what they were for, in their file names.
"""
from __future__ import annotations

import argparse
import json
import sys
import tarfile
from pathlib import Path

from megavm.flywheel.results import DEFAULT_CTX, RESULTS_DIR, SCHEMAS, default_slug, index, validate, write


def _docs_in(src: Path) -> list[tuple[str, dict]]:
    """(name, doc) of every *.json in a folder (recursively) or a tar archive, in name order."""
    if src.is_dir():
        return [(str(p.relative_to(src)), json.loads(p.read_text())) for p in sorted(src.rglob("*.json"))]
    if not src.is_file() or not tarfile.is_tarfile(src):
        raise ValueError(f"{src}: not a folder or a tar archive")
    with tarfile.open(src) as tar:
        members = sorted((m for m in tar.getmembers() if m.isfile() and m.name.endswith(".json")), key=lambda m: m.name)
        return [(m.name, json.loads(tar.extractfile(m).read())) for m in members]


def import_runs(src, out_dir, commit: str | None = None, slug: str | None = None) -> list[Path]:
    """File every run doc of src (a folder or a tar archive of a device call's $OUT) under out_dir.

    Each file's slug is `slug`, the doc's models and its context (beside the default one). `commit`
    relabels a run measured on a tree that was committed after it ran: the note keeps the old label.
    Every doc is validated before any is written. With `commit`, the docs must carry one label: runs of
    several trees in one source (a stale file left in the folder, say) would all be filed as one."""
    docs = []
    found = _docs_in(Path(src))
    labels = sorted({str(doc.get("commit")) for _, doc in found if isinstance(doc, dict)})
    if commit and len(labels) > 1:
        raise ValueError(f"{src}: runs labelled {', '.join(labels)}; --commit {commit} would file them all as one "
                         "tree: file each tree's runs on its own")
    for name, doc in found:
        if not isinstance(doc, dict) or doc.get("kind") not in SCHEMAS:
            raise ValueError(f"{name}: not a run doc (kind one of {', '.join(SCHEMAS)})")
        doc = dict(doc)
        if commit and doc.get("commit") != commit:
            doc["note"] = f"{doc.get('note', '')} (measured as {doc.get('commit')}, the same tree as {commit})".strip()
            doc["commit"] = commit
        ctxs = list(dict.fromkeys([doc.get("ctx")] + [r.get("ctx") for r in doc.get("rows", []) if isinstance(r, dict)]))
        ctx = "-".join(f"ctx{c}" for c in ctxs if isinstance(c, int) and c != DEFAULT_CTX)
        doc["slug"] = "-".join(x for x in (slug, default_slug(doc), ctx) if x)
        problems = validate({k: v for k, v in doc.items() if k != "slug"})
        if problems:
            raise ValueError(f"{name}: " + "; ".join(problems))
        docs.append(doc)
    return [write(doc, out_dir) for doc in docs]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python3 -m megavm.flywheel.file_runs", description=__doc__.split("\n")[0])
    ap.add_argument("src", type=Path, help="a folder or tar archive of run docs")
    ap.add_argument("--dir", type=Path, default=RESULTS_DIR, help="the results folder (default: bench/results)")
    ap.add_argument("--commit", help="the commit to file the runs under")
    ap.add_argument("--slug", help="what the runs were for, in their file names")
    a = ap.parse_args(argv)
    try:
        paths = import_runs(a.src, a.dir, a.commit, a.slug)
        text = index(a.dir)
    except (ValueError, OSError, tarfile.TarError, json.JSONDecodeError) as e:
        print(f"not filed: {e}", file=sys.stderr)
        return 1
    for path in paths:
        print(path)
    (a.dir / "README.md").write_text(text)
    print(f"wrote {a.dir / 'README.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
