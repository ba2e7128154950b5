"""A real, non-editable install: the wheel holds one import root, megavm, with every CUDA source as
package data, and its console script decodes from another directory with PASS."""
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


SOURCES = ("core", "instructions", "schedule", "vm", "flywheel", "megavm", "pyproject.toml", "README.md")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel, built from a copy of the sources (the build writes its scratch beside them)."""
    src, out = tmp_path_factory.mktemp("src"), tmp_path_factory.mktemp("wheel")
    for name in SOURCES:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(ROOT / name, src / name)
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out),
                        str(src)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    (whl,) = out.glob("megavm-*.whl")
    return whl


def test_wheel_has_one_import_root_and_the_cuda_sources(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names}
    assert tops == {"megavm", f"{wheel.name.split('-py3')[0]}.dist-info"}, f"top-level entries {sorted(tops)}"
    device = {f"megavm/{p.relative_to(ROOT).as_posix()}" for d in ("core", "instructions", "vm/kernel")
              for p in (ROOT / d).glob("*") if p.suffix in (".h", ".cuh", ".cu")}
    assert device and device <= set(names), f"missing from the wheel: {sorted(device - set(names))}"
    modules = {f"megavm/{p.relative_to(ROOT).as_posix()}" for d in ("core", "instructions", "schedule", "vm", "flywheel")
               for p in (ROOT / d).glob("*.py")}
    assert modules <= set(names), f"missing from the wheel: {sorted(modules - set(names))}"


def test_installed_console_script_runs_from_another_directory(wheel, tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True, timeout=300)
    py, exe = venv / "bin" / "python", venv / "bin" / "megavm"
    r = subprocess.run([str(py), "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    where = subprocess.run([str(py), "-c", "import megavm, megavm.vm; print(megavm.vm.__file__)"], cwd=tmp_path,
                           capture_output=True, text=True, check=True).stdout.strip()
    assert where.startswith(str(venv)), f"megavm imported from {where}, not the installed copy"
    r = subprocess.run([str(exe), "run", "--model", "tiny", "--tokens", "8"], cwd=tmp_path, capture_output=True,
                       text=True, timeout=300, env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "OMP_NUM_THREADS": "1"})
    assert r.returncode == 0 and r.stdout.strip().splitlines()[-1].startswith("PASS"), r.stdout + r.stderr
