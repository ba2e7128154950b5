"""Build the megakernel with nvcc into a shared library loaded with ctypes.

One build per content hash of every source and header, the flags (build knobs among them), the
target arch, the compiler version and the ABI version; written atomically into the cache folder, with
an in-process cache in front. A build refuses generated files that are stale against the opcode specs
(vm/codegen.py). `python3 -m megavm.vm.build --arch sm_80 --arch sm_90a` compiles without a GPU.
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
from pathlib import Path

from megavm.core import abi
from megavm.core.errors import BuildError
from megavm.vm import codegen, env

ROOT = codegen.ROOT              # the folder holding core/, instructions/ and vm/ (a checkout or the package)
MAIN = ROOT / "vm" / "kernel" / "megakernel.cu"
BASE_FLAGS = ["-std=c++17", "-O3", "-Xcompiler", "-fPIC", "-shared", "-lineinfo"]
_loaded: dict[str, ctypes.CDLL] = {}


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


def build(arch: str | None = None, defines: dict[str, int] | None = None, compile_only: bool = False) -> Path:
    """Compile (or find in the cache) the library for arch; returns its path."""
    arch = arch or device_arch()
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
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return target


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
    args = ap.parse_args(argv)
    defines = dict(d.split("=", 1) for d in args.define)
    for arch in args.arch or [device_arch()]:
        print(f"{arch}: {build(arch, defines, compile_only=args.compile_only)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
