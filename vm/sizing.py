"""The shared memory a program leaves free, as ring stages.

A block's shared memory holds the weight ring (MVM_STAGES stages of 16 KiB) and xs, the activation
vector and every opcode's scratch (MEGAVM_MAX_K floats: 64 KiB, sized for the largest K any program may
have). Most programs need far less xs: a dense model its largest GEMV K and that GEMV's per-warp row
sums (consumer warps x its tile's rows). What xs a task uses is stated once, beside its opcode
(OpSpec.shared); `xs_need` takes the most over a program's tasks at pack time, and MegakernelVM builds
the kernel with the smallest xs of `TIERS` that holds it: the most xs beside 13, 12 or 11 ring stages,
or the default build (on an H100, llama-1b at ctx 128: 12 stages, 1.8% faster than the default build;
qwen3-1.7b: 12, 2.6%; docs/performance.md, sessions 45 and 46). A program with a task whose need is not
stated keeps the whole MAX_K and the default ring.
"""
from __future__ import annotations

import re

from megavm.core.errors import UserError
from megavm.core.limits import CONSUMER_THREADS, MAX_K, MAX_TILE_ROWS, STAGE_BYTES, STAGES
from megavm.instructions import spec
from megavm.vm import env

SMEM_BYTES = 227 * 1024                          # the most shared memory an sm_90 block may hold


def smem_bytes(xs: int, stages: int) -> int:
    """The kernel's shared memory (instructions/device.cuh: mvm_smem) with xs floats and `stages` ring stages:
    ring, xs, acc (2 x MAX_TILE_ROWS floats), red (2 a consumer warp), the full and empty barriers, abort
    and inline_next, rounded up to the ring's 128-byte alignment (megakernel.cu asserts it fits)."""
    return -(-_fields(xs, stages) // 128) * 128


def _fields(xs: int, stages: int) -> int:
    return stages * STAGE_BYTES + 4 * xs + 8 * MAX_TILE_ROWS + 8 * (CONSUMER_THREADS // 32) + 16 * stages + 8


def _tiers() -> tuple[tuple[int, int], ...]:
    """(MEGAVM_MAX_K, MVM_STAGES) builds, smallest xs first: for each ring from the default STAGES up, the
    most xs (a multiple of 4 floats, at most MAX_K) that fits beside it, while that holds a 1024-float x."""
    out, stages = [], STAGES
    while (xs := min(MAX_K, (SMEM_BYTES - _fields(0, stages)) // 16 * 4)) >= 1024:
        out.append((xs, stages))
        stages += 1
    return tuple(reversed(out))


# on an sm_90 block: (4280, 13), (8380, 12), (12480, 11), and (MAX_K, STAGES): the default build
TIERS = _tiers()
# build knobs that change what a tier holds, or that take xs the opcodes' statements leave out (the 4-bit
# tensor-core paths keep their fragments above x): a caller who sets one keeps the default sizes
SIZE_KNOBS = ("MEGAVM_MAX_K", "MVM_STAGES", "MVM_STAGE_BYTES", "MVM_CONSUMER_WARPS", "MVM_E2M1_MMA", "MVM_E2M1_F8",
              "MVM_U4_IMMA", "MVM_U4_IMMA_LONG", "MVM_U4_TAB_AHEAD")


def _set_by_caller(defines: dict[str, int] | None) -> dict[str, int]:
    """The build knobs a caller set: -DNAME=VALUE in MEGAVM_NVCC_FLAGS, then defines (vm/build.py passes both)."""
    flags = re.findall(r"-D\s*(\w+)(?:=(\S*))?", env.get("MEGAVM_NVCC_FLAGS") or "")
    return {k: int(v) if v.lstrip("-").isdigit() else 1 for k, v in flags} | dict(defines or {})


def xs_need(program) -> int | None:
    """Floats of xs the program's tasks use at most (schedule.ir.Program); None when a task's opcode does
    not state its need for its operands."""
    most = 0
    for i, t in enumerate(program.tasks):
        s = spec(t.opcode)
        n = s.shared(t.params, *program.operands(i)) if s.shared else None
        if n is None:
            return None
        most = max(most, n)
    return most


def ring_defines(need: int | None, defines: dict[str, int] | None = None) -> dict[str, int]:
    """The build knobs (MEGAVM_MAX_K, MVM_STAGES) for a program whose tasks use `need` floats of xs: {} for
    the default build (need unknown or above every smaller tier, or the caller set a knob that sizes it,
    in defines or MEGAVM_NVCC_FLAGS)."""
    if need is None or any(k in _set_by_caller(defines) for k in SIZE_KNOBS):
        return {}
    for xs, stages in TIERS:
        if need <= xs:
            return {} if xs == MAX_K else {"MEGAVM_MAX_K": xs, "MVM_STAGES": stages}
    return {}


def check_xs(need: int | None, defines: dict[str, int] | None = None) -> None:
    """UserError, in one line, where the caller's MEGAVM_MAX_K (in defines or MEGAVM_NVCC_FLAGS) is below
    what the program's tasks use: its shared memory would overrun. A program whose need is not stated
    takes the whole MAX_K."""
    xs = _set_by_caller(defines).get("MEGAVM_MAX_K")
    if xs is not None and xs % 4:
        raise UserError(f"MEGAVM_MAX_K={xs}: must be a multiple of 4 (xs is read 16 bytes at a time)")
    if xs is not None and xs < (MAX_K if need is None else need):
        what = f"{need} floats of xs" if need is not None else f"the whole xs ({MAX_K} floats: a task states none)"
        raise UserError(f"MEGAVM_MAX_K={xs}: the program's tasks use {what}; build with at least that many")


def describe(defines: dict[str, int]) -> str:
    """One line on a MegakernelVM's shared memory, from the knobs it was built with (vm.defines)."""
    xs, stages = defines.get("MEGAVM_MAX_K", MAX_K), defines.get("MVM_STAGES", STAGES)
    how = ("the defaults" if (xs, stages) == (MAX_K, STAGES) else
           "a tier sized to the program" if (xs, stages) in TIERS else "as set")
    return f"shared memory: {xs} floats of xs and {stages} ring stages ({how})"
