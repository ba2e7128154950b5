"""Runtime inputs: checked on the host before anything runs, so a bad token id or position leaves the
KV cache and the loaded program as they were. Which input slot carries what, and which operand's
extent bounds it, each opcode's spec declares (instructions/spec.py: Slot.role, Slot.bound)."""
from __future__ import annotations

import numpy as np

from megavm.core.errors import InputError
from megavm.core.types import BufferKind
from megavm.instructions import spec
from megavm.instructions.spec import POSITION, TOKEN
from megavm.vm.pack import PackedProgram


def input_limits(packed: PackedProgram) -> dict[str, tuple[str, int]]:
    """name -> (its role, exclusive upper bound) for each runtime input an opcode bounds."""
    limits: dict[str, tuple[str, int]] = {}
    for r in packed.instrs:
        s = spec(int(r["opcode"]))
        operands = {x.name: int(b) for x, b in zip(s.inputs + s.outputs,
                                                   list(r["inputs"][:r["n_inputs"]]) + list(r["outputs"][:r["n_outputs"]]))}
        for slot in s.inputs:
            if not slot.role or slot.bound is None or operands[slot.name] < 0 or operands[slot.bound[0]] < 0:
                continue
            name = packed.names[operands[slot.name]]
            hi = packed.shape(operands[slot.bound[0]])[slot.bound[1]]
            if name not in limits or hi < limits[name][1]:
                limits[name] = (slot.role, hi)
    return limits


def input_roles(packed: PackedProgram) -> dict[str, str]:
    """role (TOKEN, POSITION) -> the name of the INPUT buffer that carries it."""
    roles: dict[str, str] = {}
    for r in packed.instrs:
        s = spec(int(r["opcode"]))
        for slot, b in zip(s.inputs, r["inputs"][:r["n_inputs"]]):
            if slot.role and b >= 0:
                roles.setdefault(slot.role, packed.names[int(b)])
    return roles


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


def check_generation(packed: PackedProgram, prompt_ids, n, start_pos, limits: dict | None = None) -> tuple[list[int], int]:
    """(prompt, steps) of a greedy generation of n tokens after the prompt from start_pos: every token
    id and every position it will reach checked before anything runs."""
    limits = input_limits(packed) if limits is None else limits
    roles = input_roles(packed)
    tok, pos = roles.get(TOKEN, "token"), roles.get(POSITION, "pos")
    prompt = list(prompt_ids)
    if not prompt:
        raise InputError("generate needs at least one prompt token")
    n, start_pos = _count(n, "n"), _count(start_pos, "start_pos")
    if n < 1:
        raise InputError(f"generate needs n >= 1 new tokens, got {n}")
    steps = len(prompt) + n - 1
    prompt = [check_inputs(packed, {tok: t, pos: start_pos + i}, limits)[tok] for i, t in enumerate(prompt)]
    check_inputs(packed, {tok: prompt[0], pos: start_pos + steps - 1}, limits)
    return prompt, steps


def _count(v, name: str) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
        raise InputError(f"generate's {name} must be an int, got {type(v).__name__}")
    return int(v)
