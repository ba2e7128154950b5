"""Every knob megavm reads from the environment: one table, one prefix (MEGAVM_), with defaults."""
from __future__ import annotations

import os
from pathlib import Path

from megavm.core.errors import UserError

KNOBS = {
    "MEGAVM_CACHE_DIR": ("~/.cache/megavm", "where compiled megakernels are kept"),
    "MEGAVM_NVCC": ("nvcc on PATH, else /usr/local/cuda/bin/nvcc", "the CUDA compiler"),
    "MEGAVM_ARCH": ("from the live device (sm_90a on an H100)", "target architecture, e.g. sm_90a or sm_80"),
    "MEGAVM_NVCC_FLAGS": ("(empty)", "extra nvcc flags, appended (part of the cache key)"),
    "MEGAVM_WAIT_TIMEOUT_MS": ("1000", "a counter wait longer than this aborts the grid with a dump"),
    "MEGAVM_BUILD_VERBOSE": ("0", "1 prints nvcc's command and resource report, and keeps the report "
                                                 "beside the build (<build>.ptxas.log)"),
    "MEGAVM_BUILD_LOG": ("(none)", "a file each build a process asks for is appended to, as a line of its knobs "
                         "(`python3 -m megavm.vm.build --set FILE` compiles such a list in parallel)"),
    "MEGAVM_COMMIT": ("git rev-parse --short HEAD", "the commit megavm bench and kernel_time record (for copies of the tree without .git)"),
}


def get(name: str) -> str | None:
    assert name in KNOBS, f"undeclared knob {name}"
    v = os.environ.get(name)
    return v if v not in (None, "") else None


def cache_dir() -> Path:
    return Path(get("MEGAVM_CACHE_DIR") or "~/.cache/megavm").expanduser()


def wait_timeout_ms() -> int:
    v = get("MEGAVM_WAIT_TIMEOUT_MS")
    try:
        ms = int(v, 10) if v else 1000
    except ValueError:
        ms = 0
    if not 1 <= ms <= 3_600_000:
        raise UserError(f"MEGAVM_WAIT_TIMEOUT_MS={v!r} must be a whole number of milliseconds in [1, 3600000]")
    return ms
