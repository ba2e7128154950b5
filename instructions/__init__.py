"""Every opcode, once: instructions/<name>.py holds its spec (spec.py says what a spec declares) and
instructions/<name>.cuh its device body, op_<name>(mvm_ctx&). This package finds them: every module
here that defines SPEC is an opcode; the others hold what several opcodes share.

The C enum, the device accessors of each opcode's operands and params, the kernel's dispatch and the
docs tables are generated from these specs (`python3 -m megavm.vm.codegen`).
"""
from __future__ import annotations

import enum
import importlib
import pkgutil

from megavm.instructions.spec import NEXT_TOKEN, OpSpec


def discover(path: list[str], package: str) -> dict[int, OpSpec]:
    """code -> spec of every module of the package at path that defines SPEC, checked: each opcode in
    the module named after it, codes unique and dense from 0."""
    found: dict[int, OpSpec] = {}
    for m in sorted(pkgutil.iter_modules(path), key=lambda m: m.name):
        s = getattr(importlib.import_module(f"{package}.{m.name}"), "SPEC", None)
        if s is None:
            continue
        if s.module != m.name:
            raise ImportError(f"opcode {s.name} is defined in instructions/{m.name}.py; it belongs in "
                              f"instructions/{s.module}.py")
        if s.code in found:
            raise ImportError(f"opcodes {found[s.code].name} and {s.name} share code {s.code}")
        found[s.code] = s
    if sorted(found) != list(range(len(found))):
        raise ImportError(f"opcode codes must be 0..{len(found) - 1}, are {sorted(found)}")
    return dict(sorted(found.items()))


SPECS: dict[int, OpSpec] = discover(__path__, __name__)
Op = enum.IntEnum("Op", [(s.name, code) for code, s in SPECS.items()])


def spec(opcode: int) -> OpSpec:
    try:
        return SPECS[int(opcode)]
    except (KeyError, TypeError, ValueError):
        raise ValueError(f"unknown opcode {opcode!r}") from None


def op_name(opcode: int) -> str:
    s = SPECS.get(opcode) if isinstance(opcode, int) else None
    return s.name if s else f"opcode {opcode}"


def feeds_next_token(opcode: int) -> bool:
    """Whether the opcode writes the next token (ARGMAX, SAMPLE): its signal is the token loop's step
    counter (vm/loop.py). An unknown opcode feeds nothing (the kernel traps on it)."""
    s = SPECS.get(int(opcode))
    return s is not None and any(x.role == NEXT_TOKEN for x in s.outputs)


__all__ = ["SPECS", "Op", "OpSpec", "spec", "op_name", "feeds_next_token"]
