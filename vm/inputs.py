"""Runtime inputs: checked on the host before anything runs, so a bad token id or position leaves the
KV cache and the loaded program as they were."""
from __future__ import annotations

import numpy as np

from instructions import Op
from schedule.ir import BufferKind
from vm.errors import InputError
from vm.pack import PackedProgram


def input_limits(packed: PackedProgram) -> dict[str, tuple[str, int]]:
    """name -> (what it is, exclusive upper bound) for each runtime input the opcodes index with."""
    limits: dict[str, tuple[str, int]] = {}

    def bound(buf: int, what: str, n: int):
        name = packed.names[buf]
        if name not in limits or n < limits[name][1]:
            limits[name] = (what, n)

    for r in packed.instrs:
        op, ins, outs = int(r["opcode"]), r["inputs"], r["outputs"]
        if op == Op.EMBED:
            bound(ins[1], "token id", packed.shape(ins[0])[0])
        elif op == Op.RMS_LINEAR_KV:
            bound(ins[3], "position", packed.shape(outs[0])[1])
        elif op == Op.ATTN_PARTIAL:
            bound(ins[3], "position", packed.shape(ins[1])[1])
    return limits


def check_inputs(packed: PackedProgram, inputs: dict, limits: dict | None = None) -> dict[str, int]:
    """Validate {name: int} against the program's INPUT buffers; returns them as ints."""
    limits = input_limits(packed) if limits is None else limits
    names = [packed.names[i] for i, b in enumerate(packed.buffers) if b["kind"] == BufferKind.INPUT]
    missing = [n for n in names if n not in inputs]
    if missing:
        raise InputError(f"missing runtime inputs {missing}; the program takes {names}")
    extra = [n for n in inputs if n not in names]
    if extra:
        raise InputError(f"unknown runtime inputs {extra}; the program takes {names}")
    out = {}
    for n in names:
        v = inputs[n]
        if isinstance(v, (np.integer,)):
            v = int(v)
        if hasattr(v, "item") and getattr(v, "numel", lambda: 1)() == 1:
            v = int(v.item())
        if not isinstance(v, int) or isinstance(v, bool):
            raise InputError(f"runtime input {n!r} must be an int, got {type(v).__name__}")
        what, hi = limits.get(n, (n, 1 << 31))
        if not 0 <= v < hi:
            raise InputError(f"{what} {v} for input {n!r} is outside [0, {hi})")
        out[n] = v
    return out
