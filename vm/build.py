"""Build the megakernel with nvcc into a shared library loaded with ctypes.

One build per content hash of every source and header, the flags (build knobs among them), the
target arch, the compiler version and the ABI version; written atomically into the cache folder, with
an in-process cache in front. A build refuses generated files that are stale against the opcode specs
(vm/codegen.py). `python3 -m megavm.vm.build --arch sm_80 --arch sm_90a` compiles without a GPU;
`--set FILE --jobs N` compiles a list of builds (one line of knobs each) N at a time, such as the one
MEGAVM_BUILD_LOG collects from a run (flywheel/gpu_builds.txt: the GPU tests').
"""
from __future__ import annotations

import argparse
import ctypes
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from megavm.core import abi
from megavm.core.errors import BuildError
from megavm.vm import codegen, env

ROOT = codegen.ROOT              # the folder holding core/, instructions/ and vm/ (a checkout or the package)
MAIN = ROOT / "vm" / "kernel" / "megakernel.cu"
BASE_FLAGS = ["-std=c++17", "-O3", "-Xcompiler", "-fPIC", "-shared", "-lineinfo"]
_loaded: dict[str, ctypes.CDLL] = {}
_logged: set[str] = set()
_log_lock = threading.Lock()


def sources() -> list[Path]:
    return (sorted((ROOT / "vm" / "kernel").glob("*.cu*")) + sorted((ROOT / "instructions").glob("*.cuh")) +
            sorted((ROOT / "core").glob("*.h")))


def nvcc() -> str:
    path = env.get("MEGAVM_NVCC") or shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
    if not Path(path).exists() and not shutil.which(path):
        raise BuildError(f"nvcc not found (looked for {path!r}); install the CUDA toolkit or set MEGAVM_NVCC")
    return path


def device_arch() -> str:
    if env.get("MEGAVM_ARCH"):
        return env.get("MEGAVM_ARCH")
    import torch
    if not torch.cuda.is_available():
        raise BuildError("no CUDA device is visible, so the target arch is unknown; set MEGAVM_ARCH (e.g. sm_90a)")
    major, minor = torch.cuda.get_device_capability()
    return "sm_90a" if (major, minor) == (9, 0) else f"sm_{major}{minor}"


def gencode(arch: str) -> str:
    num = arch.removeprefix("sm_")
    return f"-gencode=arch=compute_{num},code=sm_{num}"


def _compiler_version(path: str) -> str:
    return subprocess.run([path, "--version"], capture_output=True, text=True, check=True).stdout


def flags(arch: str, defines: dict[str, int] | None = None) -> list[str]:
    extra = (env.get("MEGAVM_NVCC_FLAGS") or "").split()
    return BASE_FLAGS + [gencode(arch)] + [f"-D{k}={v}" for k, v in sorted((defines or {}).items())] + extra


def cache_key(arch: str, defines: dict[str, int] | None = None) -> str:
    h = hashlib.sha256()
    for f in sources():
        h.update(f.name.encode() + b"\0" + f.read_bytes())
    h.update(" ".join(flags(arch, defines)).encode())
    h.update(_compiler_version(nvcc()).encode())
    h.update(f"abi={abi.ABI_VERSION}".encode())
    return h.hexdigest()[:24]


def report(target: Path) -> Path:
    """Where a verbose build (MEGAVM_BUILD_VERBOSE=1) keeps its ptxas resource report: beside the build."""
    return target.with_name(target.name + ".ptxas.log")


def build(arch: str | None = None, defines: dict[str, int] | None = None, compile_only: bool = False) -> Path:
    """Compile (or find in the cache) the library for arch; returns its path."""
    arch = arch or device_arch()
    _log(defines)
    bad = codegen.stale(with_docs=False)
    if bad:
        raise BuildError(f"generated sources are stale against the opcode specs: {bad}; "
                         "run python3 -m megavm.vm.codegen")
    key = cache_key(arch, defines)
    out_dir = env.cache_dir()
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / f"megavm-{arch}-{key}.{'o' if compile_only else 'so'}"
    if target.exists():
        return target
    cmd = [nvcc()] + flags(arch, defines) + ([] if not compile_only else ["-c"])
    if compile_only:
        cmd.remove("-shared")
    verbose = env.get("MEGAVM_BUILD_VERBOSE") == "1"
    if verbose:
        cmd += ["-Xptxas", "-v"]
    fd, tmp = tempfile.mkstemp(dir=out_dir, prefix=".build-", suffix=target.suffix)
    os.close(fd)
    try:
        cmd += ["-o", tmp, str(MAIN)]
        if verbose:
            print(" ".join(cmd), file=sys.stderr)
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            log = out_dir / f"megavm-{arch}-{key}.log"
            log.write_text(" ".join(cmd) + "\n" + r.stderr)
            first = next((l for l in r.stderr.splitlines() if "error" in l), r.stderr.strip()[:200])
            raise BuildError(f"nvcc failed for {arch} (exit {r.returncode}): {first.strip()} (whole log: {log})")
        if verbose:
            print(r.stderr, file=sys.stderr)
            report(target).write_text(r.stderr)
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return target


def set_line(defines: dict | None) -> str:
    """A build's line in a build set: its knobs as NAME=VALUE, sorted, space-separated; '-' for none."""
    return " ".join(f"{k}={v}" for k, v in sorted((defines or {}).items())) or "-"


def parse_knobs(words: list[str]) -> dict[str, str] | None:
    """NAME=VALUE words as a dict ('-' alone: no knobs); None when a word is not NAME=VALUE."""
    if words == ["-"]:
        return {}
    pairs = [w.split("=", 1) for w in words]
    if not all(len(p) == 2 and p[0] and p[1] for p in pairs):
        return None
    return dict(pairs)


def parse_set(text: str) -> list[dict[str, str]]:
    """A build set's builds, each once, in file order: a line of NAME=VALUE words ('-' alone: no knobs);
    blank lines and '#' comments are skipped."""
    out, seen = [], set()
    for n, raw in enumerate(text.splitlines(), 1):
        words = raw.split("#", 1)[0].split()
        if not words:
            continue
        d = parse_knobs(words)
        if d is None:
            raise BuildError(f"build set line {n}: {raw.strip()!r} is not NAME=VALUE words (or '-' for no knobs)")
        if set_line(d) not in seen:
            seen.add(set_line(d))
            out.append(d)
    return out


def _log(defines: dict | None) -> None:
    """Append this build's line to MEGAVM_BUILD_LOG, once a process."""
    path = env.get("MEGAVM_BUILD_LOG")
    line = set_line(defines)
    with _log_lock:
        if path and line not in _logged:
            _logged.add(line)
            with open(path, "a") as f:
                f.write(line + "\n")


def load(arch: str | None = None, defines: dict[str, int] | None = None) -> ctypes.CDLL:
    """The compiled library, built if needed; cached in-process."""
    path = str(build(arch, defines))
    if path not in _loaded:
        lib = ctypes.CDLL(path)
        lib.mvm_launch.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p]
        lib.mvm_prepare.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_int)]
        lib.mvm_error_string.restype = ctypes.c_char_p
        if lib.mvm_abi_version() != abi.ABI_VERSION:
            raise BuildError(f"library at {path} has ABI {lib.mvm_abi_version()}, expected {abi.ABI_VERSION}")
        _loaded[path] = lib
    return _loaded[path]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="compile the megakernel (no GPU needed)")
    ap.add_argument("--arch", action="append", help="e.g. sm_90a, sm_80 (repeatable); default: the live device")
    ap.add_argument("--compile-only", action="store_true", help="object file only (no link)")
    ap.add_argument("--define", action="append", default=[], help="NAME=VALUE passed to nvcc")
    ap.add_argument("--set", metavar="FILE", help="build every line of FILE (NAME=VALUE words; '-': no knobs) "
                                                  "instead of one build; --define adds to each")
    ap.add_argument("--jobs", type=int, default=1, metavar="N", help="with --set, N builds at a time (default 1)")
    args = ap.parse_args(argv)
    defines = parse_knobs(args.define)
    if defines is None:
        raise SystemExit(f"--define {' '.join(args.define)}: each must be NAME=VALUE")
    if args.jobs < 1:
        raise SystemExit(f"--jobs {args.jobs}: must be at least 1")
    try:
        sets = [{**d, **defines} for d in parse_set(Path(args.set).read_text())] if args.set else [defines]
    except (OSError, BuildError) as e:
        raise SystemExit(f"--set {args.set}: {e}") from None
    jobs = [(arch, d) for arch in args.arch or [device_arch()] for d in sets]
    failed = 0
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:     # each build is an nvcc process
        futures = [pool.submit(build, arch, d, args.compile_only) for arch, d in jobs]
        for (arch, d), fut in zip(jobs, futures):
            try:
                print(f"{arch}: {fut.result()}" + (f"  ({set_line(d)})" if args.set else ""), flush=True)
            except BuildError as e:
                failed += 1
                print(f"{arch} ({set_line(d)}): {e}", file=sys.stderr, flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
