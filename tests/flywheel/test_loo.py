"""flywheel/loo.py without a GPU: the shapes each shard leaves out, and the summary of the run docs the
shards write (how the prior's evidence is gathered on a host of several GPUs, docs/flywheel.md)."""
import json

from megavm.flywheel import loo, results
from megavm.flywheel.corpus import Corpus, Row, shape_of
from megavm.schedule.models import PRESETS

GPU = "NVIDIA H200"
MODELS = ("small", "llama-1b", "qwen3-1.7b", "gemma-2b", "qwen2.5-1.5b")


def tuned_corpus(path) -> Corpus:
    c = Corpus(path)
    for k, m in enumerate(MODELS):
        c.add(Row(model=m, shape=shape_of(PRESETS[m], "bf16"), gpu=GPU, ctx=128, knobs={"schedule": {}, "build": {}},
                  kernel_ms=1.0 + k, verdict="PASS", rel_err=1e-5, commit="abc1234", date="2026-11-28"))
    return c


def test_shards_leave_out_every_tuned_shape_once(tmp_path):
    with tuned_corpus(tmp_path / "c.sqlite") as c:
        whole = [r.model for r in loo.held_out(c, GPU)]
        parts = [[r.model for r in loo.held_out(c, GPU, (i, 3))] for i in range(3)]
        assert sorted(whole) == sorted(MODELS)
        assert parts == [whole[0::3], whole[1::3], whole[2::3]]
        assert loo.held_out(c, "NVIDIA H100 80GB HBM3") == []


def prior_doc(tmp_path, name, rows) -> str:
    doc = dict(kind="prior", schema=results.SCHEMA_VERSION, device=GPU, date="2026-11-28", commit="abc1234",
               command="python3 -m megavm.flywheel.loo --shard 0/2", note="a test run", rows=rows)
    (tmp_path / name).write_text(json.dumps(doc))
    return str(tmp_path / name)


def shape_row(model, default, best, prior, verdict="PASS") -> dict:
    return dict(model=model, ctx=128, verdict=verdict, default_ms=default, best_ms=best, prior_ms=prior,
                prior_from="a, b, c", best_knobs="o_rows=32", prior_knobs="defaults")


def test_summary_adds_up_the_shards_docs(tmp_path, capsys):
    a = prior_doc(tmp_path, "a.json", [shape_row("small", 0.230, 0.220, 0.225), shape_row("llama-1b", 0.800, 0.780, 0.820)])
    b = prior_doc(tmp_path, "b.json", [shape_row("gemma-2b", 1.700, 1.650, 1.660)])
    assert loo.main(["--summary", a, b]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 4 and out[0].startswith("small") and out[2].startswith("gemma-2b")
    # within 3%: small (2.3% over its best) and gemma-2b (0.6%), not llama-1b (5.1%); mean gain over the
    # defaults (2.17% - 2.50% + 2.35%) / 3
    assert out[-1] == "prior within 3% of the best on 2 of 3 shapes; on average +0.68% under the defaults"


def test_summary_and_shard_refusals_are_one_line(tmp_path, capsys):
    failing = prior_doc(tmp_path, "f.json", [shape_row("small", 0.23, 0.22, 0.22, verdict="FAIL")])
    assert loo.main(["--summary", failing]) == 1
    capsys.readouterr()
    other = tmp_path / "k.json"
    other.write_text(json.dumps({"kind": "tune", "rows": []}))
    assert loo.main(["--summary", str(other)]) == 2
    assert capsys.readouterr().err.strip() == f"loo: {other}: not a leave-one-out run doc (kind 'prior')"
    assert loo.main(["--summary", str(tmp_path / "missing.json")]) == 2
    assert capsys.readouterr().err.startswith(f"loo: {tmp_path / 'missing.json'}: not readable as JSON")
    for bad in ("3/3", "1", "a/2", "-1/2"):
        assert loo.main([f"--shard={bad}"]) == 2
        assert capsys.readouterr().err.strip() == f"loo: --shard {bad}: expected I/N with 0 <= I < N (2/4, say)"
