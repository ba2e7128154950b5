"""Runtime inputs: checked on the host before anything runs, so a bad token id, position or input
tensor leaves the KV cache and the loaded program as they were. A scalar input (one i32) that carries
a token id or position goes to the kernel by value; every other input (an adapter id, a batch of
features) lives in device memory, written by the host before the launch. Which input slot carries
what, and which operand's extent bounds it, each opcode's spec declares (instructions/spec.py:
Slot.role, Slot.bound)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from megavm.core.errors import InputError
from megavm.core.types import BufferKind, DType
from megavm.instructions import SPECS
from megavm.instructions.sampling import check_kernel_params
from megavm.instructions.spec import POSITION, SAMPLING, TOKEN
from megavm.vm.pack import PackedProgram


def input_limits(packed: PackedProgram) -> dict[str, tuple[str, int]]:
    """name -> (its role, exclusive upper bound) for each runtime input a slot with a role reads (the
    bound from the slot's `bound` operand, else 2^31). An opcode no spec knows is passed over: the
    kernel traps on it, and ReferenceVM refuses it."""
    limits: dict[str, tuple[str, int]] = {}
    for r in packed.instrs:
        s = SPECS.get(int(r["opcode"]))
        if s is None:
            continue
        operands = {x.name: int(b) for x, b in zip(s.inputs + s.outputs,
                                                   list(r["inputs"][:r["n_inputs"]]) + list(r["outputs"][:r["n_outputs"]]))}
        for slot in s.inputs:
            if not slot.role or operands[slot.name] < 0:
                continue
            name = packed.names[operands[slot.name]]
            bounded = slot.bound is not None and operands[slot.bound[0]] >= 0
            hi = packed.shape(operands[slot.bound[0]])[slot.bound[1]] if bounded else 1 << 31
            if name not in limits or hi < limits[name][1]:
                limits[name] = (slot.role, hi)
    return limits


def input_roles(packed: PackedProgram) -> dict[str, str]:
    """role (TOKEN, POSITION) -> the name of the INPUT buffer that carries it."""
    roles: dict[str, str] = {}
    for r in packed.instrs:
        s = SPECS.get(int(r["opcode"]))
        if s is None:
            continue
        for slot, b in zip(s.inputs, r["inputs"][:r["n_inputs"]]):
            if slot.role and b >= 0:
                roles.setdefault(slot.role, packed.names[int(b)])
    return roles


def is_scalar(packed: PackedProgram, b: int) -> bool:
    """A scalar runtime input (one i32: a token id, a position, an adapter id) rather than a tensor."""
    return packed.shape(b) == (1,) and int(packed.buffers[b]["dtype"]) == DType.I32


def input_names(packed: PackedProgram) -> list[str]:
    return [packed.names[i] for i, b in enumerate(packed.buffers) if b["kind"] == BufferKind.INPUT]


@dataclass(frozen=True)
class _Input:
    buffer: int
    scalar: bool
    shape: tuple[int, ...]
    dtype: DType
    what: str                   # its role (token id, position, ...) or its name: what a message calls it
    hi: int                     # exclusive upper bound of its values


class RuntimeInputs:
    """A program's runtime inputs, read off its tables once, so that checking a step's inputs costs
    a few operations per input (it runs before every launch)."""

    def __init__(self, packed: PackedProgram):
        limits, roles = input_limits(packed), input_roles(packed)
        self.names = input_names(packed)
        self.token, self.pos = roles.get(TOKEN, "token"), roles.get(POSITION, "pos")
        logits = packed.names.index("logits") if "logits" in packed.names else -1
        self.vocab = packed.shape(logits)[0] if logits >= 0 else 0
        self._by_name: dict[str, _Input] = {}
        for n in self.names:
            b = packed.buffer_id(n)
            what, hi = limits.get(n, (n, 1 << 31))
            self._by_name[n] = _Input(b, is_scalar(packed, b), packed.shape(b),
                                      DType(int(packed.buffers[b]["dtype"])), what, hi)

    def buffer_id(self, name: str) -> int:
        return self._by_name[name].buffer

    def check(self, inputs: dict) -> dict[str, int | torch.Tensor]:
        """Validate a step's runtime inputs against the program's INPUT buffers, before anything is
        written. A scalar input is an int; a tensor input a torch tensor or numpy array of exactly its
        buffer's shape: floating values for an f32 buffer (each finite), integers for an i32 one (each
        in range). Returns the scalars as ints and the tensors as contiguous CPU tensors of the
        buffer's dtype."""
        if len(inputs) != len(self._by_name) or any(n not in self._by_name for n in inputs):
            missing = [n for n in self.names if n not in inputs]
            if missing:
                raise InputError(f"missing runtime inputs {missing}; the program takes {self.names}")
            extra = [n for n in inputs if n not in self._by_name]
            raise InputError(f"unknown runtime inputs {extra}; the program takes {self.names}")
        out: dict[str, int | torch.Tensor] = {}
        for n, x in self._by_name.items():
            if x.scalar:
                out[n] = _scalar(n, inputs[n], x.what, x.hi)
            else:
                out[n] = _tensor(n, inputs[n], x.shape, x.dtype, x.what, x.hi)
                if x.what == SAMPLING:
                    _sampling(n, out[n], self.vocab)
        return out

    def check_generation(self, prompt_ids, n, start_pos, others: dict | None = None) -> tuple[list[int], int, dict]:
        """(prompt, steps, other inputs) of a greedy generation of n tokens after the prompt from start_pos:
        every token id and every position it will reach checked before anything runs, and the program's
        other runtime inputs (an adapter id), held for the whole generation, checked as a step's are."""
        prompt = list(prompt_ids)
        if not prompt:
            raise InputError("generate needs at least one prompt token")
        n, start_pos = _count(n, "n"), _count(start_pos, "start_pos")
        if n < 1:
            raise InputError(f"generate needs n >= 1 new tokens, got {n}")
        steps = len(prompt) + n - 1
        tok, pos = self._by_name[self.token], self._by_name[self.pos]
        prompt = [_scalar(self.token, t, tok.what, tok.hi) for t in prompt]
        for at in (start_pos, start_pos + steps - 1):
            _scalar(self.pos, at, pos.what, pos.hi)
        others = dict(others or {})
        if self.token in others or self.pos in others:
            raise InputError(f"generate feeds {self.token!r} and {self.pos!r} itself; give only the program's other inputs")
        vals = self.check({self.token: prompt[0], self.pos: start_pos, **others})
        return prompt, steps, {k: v for k, v in vals.items() if k not in (self.token, self.pos)}


def check_inputs(packed: PackedProgram, inputs: dict) -> dict[str, int | torch.Tensor]:
    """RuntimeInputs(packed).check(inputs), for a program checked once."""
    return RuntimeInputs(packed).check(inputs)


def check_generation(packed: PackedProgram, prompt_ids, n, start_pos, others: dict | None = None):
    return RuntimeInputs(packed).check_generation(prompt_ids, n, start_pos, others)


def _scalar(n: str, v, what: str, hi: int) -> int:
    if isinstance(v, (np.integer,)):
        v = int(v)
    if hasattr(v, "item") and getattr(v, "numel", lambda: 1)() == 1:
        v = v.item()
    if not isinstance(v, int) or isinstance(v, bool):
        raise InputError(f"runtime input {n!r} must be an int, got {type(v).__name__}")
    if not 0 <= v < hi:
        raise InputError(f"{what} {v} for input {n!r} is outside [0, {hi})")
    return v


def _tensor(n: str, v, shape: tuple[int, ...], dt: DType, what: str, hi: int) -> torch.Tensor:
    if isinstance(v, np.ndarray):
        if v.dtype.kind not in "biuf":
            raise InputError(f"runtime input {n!r} must be numbers, got an array of {v.dtype}")
        v = torch.from_numpy(np.ascontiguousarray(v))
    if not isinstance(v, torch.Tensor):
        raise InputError(f"runtime input {n!r} must be a tensor of shape {shape}, got {type(v).__name__}")
    if tuple(v.shape) != shape:
        raise InputError(f"runtime input {n!r} has shape {tuple(v.shape)}, the program expects {shape}")
    v = v.detach().cpu()
    if dt == DType.I32:
        if v.is_floating_point() or v.is_complex() or v.dtype == torch.bool:
            raise InputError(f"runtime input {n!r} must hold integers, got {v.dtype}")
        v64 = v.long()
        bad = (v64 < 0) | (v64 >= hi)
        if bad.any():
            at = tuple(int(i) for i in bad.nonzero()[0])
            raise InputError(f"{what} {int(v64[at])} at {list(at)} of input {n!r} is outside [0, {hi})")
        return v64.to(torch.int32).contiguous()
    if not v.is_floating_point():
        raise InputError(f"runtime input {n!r} must hold floating-point values, got {v.dtype}")
    v = v.to(dt.torch)
    bad = ~torch.isfinite(v)
    if bad.any():
        at = tuple(int(i) for i in bad.nonzero()[0])
        raise InputError(f"runtime input {n!r} holds {float(v[at])} at {list(at)}; values must be finite")
    return v.contiguous()


def _sampling(n: str, v: torch.Tensor, vocab: int) -> None:
    """(temperature, top_k, top_p) as the kernel's SAMPLE takes them; top_k a whole number."""
    t, k, p = (float(f"{float(x):.7g}") for x in v)       # as written (an f32 0.9 reads 0.9, not 0.8999999761)
    if k != int(k):
        raise InputError(f"runtime input {n!r}: top_k {k} must be a whole number")
    try:
        check_kernel_params(t, int(k), p, vocab)
    except ValueError as e:
        raise InputError(f"runtime input {n!r}: {e}") from None


def _count(v, name: str) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
        raise InputError(f"generate's {name} must be an int, got {type(v).__name__}")
    return int(v)
