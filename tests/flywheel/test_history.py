"""flywheel/history.py: a model's baseline times across commits, and the mark on a commit slower than every
earlier one (the view that would have shown session 47's 10% step; docs/performance.md, session 56)."""
from megavm.flywheel import history, results

H200 = "NVIDIA H200"


def kt(commit: str, date: str, ms: float, device: str = H200, **row) -> dict:
    return {"kind": "kernel_time", "schema": 1, "device": device, "date": date, "commit": commit,
            "command": "python3 -m megavm.flywheel.kernel_time --models llama-1b", "note": "a test run",
            "rows": [{"model": "llama-1b", "ctx": 128, "ablations": "baseline", "verdict": "PASS", "kernel_ms": ms,
                      **row},
                     {"model": "llama-1b", "ctx": 128, "ablations": "build.MVM_STAGES=8", "verdict": "PASS",
                      "kernel_ms": 0.1}]}


def bench(commit: str, date: str, ms: float, **row) -> dict:
    return {"kind": "bench", "schema": 1, "device": H200, "date": date, "commit": commit, "command": "megavm bench",
            "note": "a test run", "copy_GBps": 4200.0,
            "rows": [{"model": "llama-1b", "ctx": 128, "GB": 2.48, "floor_ms": 0.59, "tasks": 8570, "verdict": "PASS",
                      "max_rel_err": 1e-5, "megavm_ms": ms, "megavm_e2e_ms": ms, "eager_ms": 16.0,
                      "cudagraph_ms": 3.0, **row}]}


def test_only_pass_bf16_baselines_count():
    docs = [kt("1111111", "2026-11-27", 0.80),
            kt("2222222", "2026-11-27", 0.50, verdict="FAIL"),
            bench("3333333", "2026-11-27", 0.40, weights="nvfp4"),
            bench("4444444", "2026-11-27", 0.79),
            kt("5555555", "2026-11-27", 0.60, ctx=4096),
            kt("6666666", "2026-11-27", 0.90, device="NVIDIA H100 80GB HBM3")]
    got = history.baselines(docs, "llama-1b", 128)
    assert {d: {c: p.ms for c, p in v.items()} for d, v in got.items()} == {
        H200: {"1111111": [0.80], "4444444": [0.79]}, "NVIDIA H100 80GB HBM3": {"6666666": [0.90]}}


def test_commit_order_places_working_trees_after_their_base_and_unknown_commits_by_date():
    order = {"a" * 40: 0, "b" * 40: 1, "c" * 40: 2}
    assert history._position("aaaaaaa", order) == 0
    assert history._position("bbbbbbb+wip-x", order) == 1.5
    assert history._position("ddddddd", order) is None
    assert history._position("abc", order) is None                # too short to name a commit
    pts = {c: history.Point(c, d, [1.0]) for c, d in
           [("ccccccc", "2026-11-28"), ("ddddddd", "2026-11-27"), ("aaaaaaa", "2026-11-27"), ("bbbbbbb", "2026-11-28")]}
    assert [p.commit for p in history.ordered(pts, order)] == ["aaaaaaa", "ddddddd", "bbbbbbb", "ccccccc"]


def test_a_commit_slower_than_every_earlier_one_is_marked():
    pts = [history.Point("a", "2026-11-27", [0.80, 0.81]), history.Point("b", "2026-11-27", [0.83]),
           history.Point("c", "2026-11-28", [0.88, 0.87]), history.Point("d", "2026-11-28", [0.79])]
    rows = history.drift_table(pts, drift=5.0)
    assert [(p.commit, best, at, marked) for p, best, at, marked in rows] == [
        ("a", None, None, False), ("b", 0.80, "a", False), ("c", 0.80, "a", True), ("d", 0.80, "a", False)]


def test_the_command_prints_the_step_and_refuses_what_it_cannot_show(tmp_path, capsys):
    for doc in (kt("1a2b3c4", "2026-11-26", 0.793), kt("5d6e7f8", "2026-11-27", 0.876),
                kt("5d6e7f8", "2026-11-27", 0.874), bench("9a8b7c6", "2026-11-28", 0.792)):
        results.write(doc, tmp_path)
    assert history.main(["--model", "llama-1b", "--dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out.splitlines()
    step = next(line for line in out if line.startswith("5d6e7f8"))
    assert "0.874-0.876" in step and "+10.2%" in step and "slower than 1a2b3c4" in step, out
    back = next(line for line in out if line.startswith("9a8b7c6"))
    assert "slower" not in back and "-0.1%" in back, out
    assert history.main(["--model", "qwen3-1.7b", "--dir", str(tmp_path)]) == 1
    assert "no PASS baseline of qwen3-1.7b" in capsys.readouterr().err
    assert history.main(["--model", "llama-1b", "--drift", "-1", "--dir", str(tmp_path)]) == 2
