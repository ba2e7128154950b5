"""flywheel/shards.py: a pytest selection dealt to several processes, and their counts added up (how
flywheel/gpu_check.sh runs test_megakernel.py within one device call)."""
import subprocess
import sys
from pathlib import Path

from megavm.flywheel import shards

DOCS = str(Path(__file__).resolve().parents[1] / "test_docs.py")


def test_shard_i_of_n_keeps_every_nth_test_in_collection_order(tmp_path):
    t = tmp_path / "test_seven.py"
    t.write_text("".join(f"def test_{k}():\n    pass\n\n\n" for k in range(7)))
    got = []
    for i in range(3):
        r = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                            "-p", "megavm.flywheel.shards", f"--megavm-shard={i}/3", str(t)],
                           capture_output=True, text=True, cwd=tmp_path)
        got.append([line.split("::")[1] for line in r.stdout.splitlines() if "::" in line])
    assert got == [["test_0", "test_3", "test_6"], ["test_1", "test_4"], ["test_2", "test_5"]]


def test_counts_read_pytest_summary_line():
    assert shards.counts("....\n4 passed in 0.88s\n")["passed"] == 4
    c = shards.counts("x\n9 passed, 2 failed, 1 skipped, 14 warnings, 1 error in 92.75s (0:01:32)\n")
    assert (c["passed"], c["failed"], c["skipped"], c["errors"]) == (9, 2, 1, 1)
    # an interrupted run: pytest's last line counts what ran
    assert shards.counts("!!! KeyboardInterrupt !!!\n(to show a full traceback)\n30 passed in 356.31s\n")["passed"] == 30
    assert shards.counts("no summary here") == dict.fromkeys(shards.COUNTS, 0)


def test_a_selection_runs_in_shards_and_adds_up(tmp_path, capsys):
    n = shards.collect([DOCS])
    assert n >= 2
    assert shards.main(["--shards", "2", "--log-dir", str(tmp_path), "--", DOCS]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert out[-1].startswith(f"{n} passed in ") and out[-1].endswith(f"(2 shards of {n} tests)")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["shard-0.log", "shard-1.log"]


def test_a_failing_shard_fails_the_run_and_is_counted(tmp_path, capsys):
    t = tmp_path / "test_two.py"
    t.write_text("def test_ok():\n    assert True\n\n\ndef test_bad():\n    assert 1 == 2\n")
    assert shards.main(["--shards", "2", "--log-dir", str(tmp_path / "logs"), "--", str(t)]) == 1
    out = capsys.readouterr().out.strip().splitlines()
    assert out[-1].startswith("1 passed, 1 failed in ")
    assert any(line.startswith("shard 1: 1 failed, exit 1") for line in out)


def test_nothing_to_collect_and_bad_arguments_are_one_line(tmp_path, capsys):
    empty = tmp_path / "test_none.py"
    empty.write_text("X = 1\n")
    assert shards.main(["--log-dir", str(tmp_path), "--", str(empty)]) == 5
    assert "no tests collected" in capsys.readouterr().out
    assert shards.main(["--shards", "0", "--", str(empty)]) == 2
    assert capsys.readouterr().err.strip() == "shards: --shards 0: must be at least 1"
