"""bench/results cannot drift: every run file fits its kind's schema and README.md is the generated index."""
import json

import pytest

from megavm.flywheel import file_runs, results

RESULTS = results.RESULTS_DIR


def kernel_time_doc(**over) -> dict:
    doc = {"kind": "kernel_time", "schema": 1, "device": "NVIDIA H100 80GB HBM3", "date": "2026-11-22",
           "commit": "6dc6631 -DMVM_PREFETCH_TABLES=0", "command": "python3 bench/kernel_time.py --models llama-1b",
           "note": "A test run.",
           "rows": [{"model": "llama-1b", "ctx": 128, "ablations": "baseline", "verdict": "PASS", "kernel_ms": 1.1},
                    {"model": "llama-1b", "ctx": 128, "ablations": "host_loop=True", "verdict": "PASS",
                     "kernel_ms": 1.2, "generate_ms": 2.1}]}
    doc.update(over)
    return doc


def one_of_each_kind() -> list[dict]:
    common = {k: v for k, v in kernel_time_doc().items() if k in results.COMMON}
    row = {"model": "small", "ctx": 128, "GB": 0.25, "floor_ms": 0.08, "tasks": 4519, "verdict": "PASS",
           "max_rel_err": 1e-5, "megavm_ms": 0.295, "megavm_e2e_ms": 0.3, "eager_ms": 6.0, "cudagraph_ms": 0.9}
    return [kernel_time_doc(),
            {**common, "kind": "bench", "copy_GBps": 2990.0, "rows": [row, {**row, "model": "llama-1b", "ctx": 4096,
                                                                         "megavm_ms": 1.413}]},
            {**common, "kind": "gpu_tests", "passed": 36, "failed": 1, "skipped": 0, "selection": "matches_reference"},
            {**common, "kind": "trace", "model": "llama-1b", "ctx": 128, "span_us": 1093.952,
             "ops": {"EMBED": {"tasks": 4, "wait_us": 0.5, "run_us": 2.7, "GBps_per_sm": 0.0}},
             "stages": {"qkv": {"count": 128, "mean_us": 8.6, "max_us": 10.1}}},
            {**common, "kind": "probe", "name": "chain", "numbers": {"scores_us": 1.16, "per_block_ns": [1, 2]}}]


def test_every_result_file_validates():
    files = results.run_files(RESULTS)
    assert files, f"no run files under {RESULTS}"
    problems = [f"{p.relative_to(RESULTS)}: {problem}" for p in files
                for problem in results.validate(json.loads(p.read_text()))]
    problems += [f"{p.relative_to(RESULTS)}: kind is not its folder" for p in files
                 if json.loads(p.read_text()).get("kind") != p.parent.name]
    assert not problems, "\n".join(problems)


def test_results_readme_is_the_generated_index():
    want = results.index(RESULTS)
    got = (RESULTS / "README.md").read_text()
    assert got == want, "bench/results/README.md is stale: run python3 -m megavm.flywheel.results index"


def test_check_passes_on_the_repository():
    assert results.check(RESULTS) == []


def test_write_round_trips(tmp_path):
    doc = kernel_time_doc(slug="Prefetch Tables")
    path = results.write(doc, tmp_path)
    assert path == tmp_path / "kernel_time" / "2026-11-22-6dc6631-DMVM_PREFETCH_TABLES=0-prefetch-tables.json"
    stored = json.loads(path.read_text())
    assert stored == {k: v for k, v in doc.items() if k != "slug"}
    assert "slug" in doc, "write must not change the caller's doc"
    assert [p.name for p in path.parent.iterdir()] == [path.name], "a temporary file was left behind"
    again = results.write(kernel_time_doc(), tmp_path)  # slug from the models; an existing name is not overwritten
    assert again.name == "2026-11-22-6dc6631-DMVM_PREFETCH_TABLES=0-llama-1b.json"
    assert results.write(kernel_time_doc(), tmp_path).name.endswith("-llama-1b-2.json")


def test_write_refuses_an_invalid_doc_naming_the_field(tmp_path):
    doc = kernel_time_doc()
    del doc["rows"][1]["verdict"]
    with pytest.raises(ValueError, match=r"kernel_time row 1: missing 'verdict'"):
        results.write(doc, tmp_path)
    assert not list(tmp_path.rglob("*.json"))


def test_validate_accepts_every_kind():
    for doc in one_of_each_kind():
        assert results.validate(doc) == [], doc["kind"]


@pytest.mark.parametrize("change, problem", [
    (lambda d: d.pop("commit"), "run: missing 'commit'"),
    (lambda d: d.pop("note"), "run: missing 'note'"),
    (lambda d: d.update(schema="1"), "run: 'schema' is str, not int"),
    (lambda d: d.update(date="22.11.2026"), "'date' is '22.11.2026', not YYYY-MM-DD"),
    (lambda d: d.update(kind="benchmark"), "'kind' is 'benchmark'"),
    (lambda d: d["rows"][0].update(kernel_ms="1.1"), "kernel_time row 0: 'kernel_ms' is str, not int/float"),
    (lambda d: d["rows"][1].update(ctx=True), "kernel_time row 1: 'ctx' is bool, not int"),
    (lambda d: d["rows"][0].update(verdict="OK"), "kernel_time row 0: 'verdict' is 'OK', not PASS or FAIL"),
    (lambda d: d["rows"][1].pop("model"), "kernel_time row 1: missing 'model'"),
    (lambda d: d.update(rows=[]), "kernel_time: 'rows' is empty"),
    (lambda d: d["rows"].append("baseline"), "kernel_time row 2: not an object"),
])
def test_validate_names_the_problem(change, problem):
    doc = kernel_time_doc()
    change(doc)
    problems = results.validate(doc)
    assert any(problem in p for p in problems), problems


def test_validate_checks_nested_entries():
    trace, probe = one_of_each_kind()[3:]
    trace["ops"]["EMBED"].pop("run_us")
    trace["stages"]["qkv"]["count"] = 1.5
    probe["numbers"]["phases"] = {"scores": "fast"}
    assert results.validate(trace) == ["trace op 'EMBED': missing 'run_us'",
                                       "trace stage 'qkv': 'count' is float, not int"]
    assert results.validate(probe) == ["probe numbers.phases.scores: str is not a number"]
    assert results.validate({"kind": "trace"})[0] == "run: missing 'schema'"
    assert results.validate([]) == ["run: a list, not an object"]


def test_index_and_check_of_a_folder(tmp_path):
    for doc in one_of_each_kind():
        results.write(doc, tmp_path)
    assert results.main(["check", "--dir", str(tmp_path)]) == 1  # no README yet
    assert results.main(["index", "--dir", str(tmp_path)]) == 0
    assert results.main(["check", "--dir", str(tmp_path)]) == 0
    text = (tmp_path / "README.md").read_text()
    for headline in ("small 0.295 ms PASS; llama-1b ctx 4096 1.413 ms PASS", "llama-1b 1.100 ms; 1 ablation rows",
                     "36 passed, 1 failed (-k matches_reference)", "llama-1b span 1094.0 us", "| chain |",
                     "| H100 |", "(kernel_time/2026-11-22-6dc6631-DMVM_PREFETCH_TABLES=0-llama-1b.json)"):
        assert headline in text, headline
    (tmp_path / "probe" / "stray.log").write_text("raw")
    bad = json.loads(next((tmp_path / "bench").glob("*.json")).read_text())
    del bad["rows"][0]["verdict"]
    (tmp_path / "bench" / "2026-11-22-x-bad.json").write_text(json.dumps(bad))
    problems = results.check(tmp_path)
    assert "bench/2026-11-22-x-bad.json: bench row 0: missing 'verdict'" in problems
    assert "probe/stray.log: not a run file (<kind>/*.json)" in problems
    assert results.main(["index", "--dir", str(tmp_path)]) == 1


def test_import_files_a_device_calls_runs_from_an_archive(tmp_path):
    """`file_runs` takes the docs a device call wrote (here a .tgz of its $OUT), relabels them with
    the commit the measured tree became, names them by slug, models and context, and rewrites the index;
    an archive holding something that is not a run doc files nothing, and so does a folder whose runs
    carry several labels when --commit would relabel them all as one tree."""
    import tarfile
    out = tmp_path / "out"
    for doc in (kernel_time_doc(commit="abc123-dirty", rows=[{**kernel_time_doc()["rows"][0], "ctx": 4096}]),
                {**one_of_each_kind()[3], "commit": "abc123-dirty"}):
        results.write(doc, out)
    archive = tmp_path / "results.tgz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(out, arcname=".")
    dest = tmp_path / "results"
    assert file_runs.main([str(archive), "--dir", str(dest), "--commit", "def4567", "--slug", "mma"]) == 0
    names = sorted(p.relative_to(dest).as_posix() for p in dest.rglob("*.json"))
    assert names == ["kernel_time/2026-11-22-def4567-mma-llama-1b-ctx4096.json", "trace/2026-11-22-def4567-mma-llama-1b.json"]
    kt = results.load(dest / names[0])
    assert kt["commit"] == "def4567" and "(measured as abc123-dirty, the same tree as def4567)" in kt["note"]
    assert results.main(["check", "--dir", str(dest)]) == 0
    before = sorted(dest.rglob("*.json"))
    stale = results.write({**one_of_each_kind()[3], "commit": "0ld0ld0", "note": "left from an earlier call"}, out)
    with pytest.raises(ValueError, match="runs labelled 0ld0ld0, abc123-dirty; --commit def4567 would file them all"):
        file_runs.import_runs(out, dest, "def4567", "mma")
    assert file_runs.main([str(out), "--dir", str(dest), "--commit", "def4567"]) == 1
    assert sorted(dest.rglob("*.json")) == before
    stale.unlink()
    (out / "kernel_time" / "junk.json").write_text(json.dumps({"kind": "nope"}))
    assert file_runs.main([str(out), "--dir", str(dest)]) == 1
    assert sorted(dest.rglob("*.json")) == before
