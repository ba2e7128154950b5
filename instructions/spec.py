"""What every opcode declares once: its code, operands (slots with kinds, dtypes and runtime-input
roles), named params, the regions it touches, the weight bytes the GPU loader streams for it, its
cost and its torch reference. Everything else about an opcode (the C enum, the device accessors of
its operands and params, the kernel's dispatch, the docs tables) is generated from this.

A box is a tuple of (lo, hi) per buffer axis. The KV position axis of a cache write is declared
whole, since the position is a runtime input; the validator's ordering rules stay sound that way.
Hooks take (params, inputs, outputs) with operands as `Buffer`s (name, kind, dtype, shape), None for
an optional slot left empty; the reference takes torch tensors (None likewise) and writes its outputs
in place.
"""
from __future__ import annotations

import re
import struct
from dataclasses import dataclass
from typing import Callable

from megavm.core.abi import MAX_INPUTS, MAX_OUTPUTS, MAX_PARAMS
from megavm.core.types import Buffer, BufferKind, DType

Box = tuple[tuple[int, int], ...]

W = (BufferKind.WEIGHT,)
ACT = (BufferKind.ACTIVATION, BufferKind.OUTPUT)
KV = (BufferKind.KV_CACHE,)
INP = (BufferKind.INPUT,)
FLOAT = (DType.F32, DType.BF16)
F32 = (DType.F32,)
PACKED = FLOAT + (DType.F8E4M3, DType.E2M1, DType.U4)  # weights the GEMV streams: f32, bf16, e4m3 codes with row
#                                                     scales, e2m1 (NVFP4), int4 codes with group tables (AWQ)
I32 = (DType.I32,)

# roles: what a runtime INPUT slot carries, and the output the in-kernel token loop feeds on
TOKEN = "token id"
POSITION = "position"
SPARSE_ID = "sparse id"                     # a categorical feature's raw id, hashed to a table row
NEXT_TOKEN = "next token"
SAMPLING = "sampling parameters"             # (temperature, top_k, top_p), checked by sampling.check_kernel_params
SEED = "seed"
ABSENT = -1                                 # the buffer id of an optional slot left empty


@dataclass(frozen=True)
class Slot:
    name: str
    kinds: tuple[BufferKind, ...]
    dtypes: tuple[DType, ...] = FLOAT
    role: str = ""                          # TOKEN / POSITION / SPARSE_ID (inputs), NEXT_TOKEN (outputs)
    bound: tuple[str, int] | None = None    # the runtime input must be < this (slot name, axis)'s extent
    optional: bool = False                  # may be ABSENT: the hooks then see None, the device -1
    tagged: bool = False                    # the device reads or writes a tagged buffer here (instructions/tagged.cuh)


@dataclass(frozen=True)
class Param:
    name: str
    doc: str
    f32: bool = False                       # an f32 (its IEEE bits in the param word), else an int32
    default: int | float | None = None      # what a lowering that leaves it out means (the task holds it)


@dataclass(frozen=True)
class Access:
    io: str          # "in" | "out"
    slot: int
    box: Box
    history: bool = False   # a read of KV rows that earlier steps wrote (this step's row comes from elsewhere)


@dataclass(frozen=True)
class Stream:
    """A contiguous run of one weight operand that the GPU loader copies ahead of the wait. A
    late-bound stream (index set) is one such run per expert id: for j < count, the run at
    elem_offset within expert ids[first + j] of the weight (its axis 0), ids being the i32 input at
    slot `index[0]`; the loader reads the ids once the task's wait on their writers is met.
    A history stream (window set) is a run of rows [k0, k1) of one head of a KV cache [heads,
    capacity, head_dim]: at position pos the loader copies only the rows of keys
    [max(k0, pos - window + 1), min(k1, pos)) (window 0: no window), which earlier steps wrote, once
    the task's wait on the rows' writers was met one step before."""
    slot: int        # input slot
    elem_offset: int
    elem_count: int  # of each run
    index: tuple[int, int, int] | None = None    # (ids input slot, first, count)
    window: int | None = None                    # a history stream: its sliding window (0: none)


@dataclass(frozen=True)
class Hook:
    """A device function the kernel runs before an instruction's waits, for work no counter guards
    (weights, earlier steps' KV rows): called as fn(ctx, args...), each arg an operand's buffer id or
    a param, by name. Opcodes whose args sit at the same slots and params share one call site."""
    fn: str
    args: tuple[str, ...] = ()


Operands = list[Buffer]


def no_streams(p: dict, ins: Operands, outs: Operands) -> list[Stream]:
    return []


@dataclass(frozen=True)
class OpSpec:
    name: str                               # the opcode's name; instructions/<name lowercased>.py/.cuh hold it
    code: int                               # its number in packed programs (stable: part of the ABI)
    doc: str                                # what it computes; the first paragraph goes into the docs
    inputs: tuple[Slot, ...]
    outputs: tuple[Slot, ...]
    params: tuple[Param, ...]
    check: Callable[[dict, Operands, Operands], list[str]]          # -> problems (empty when fine)
    accesses: Callable[[dict, Operands, Operands], list[Access]]
    reference: Callable[[dict, list, list], None]
    cost: Callable[[dict, Operands, Operands], tuple[int, int]]     # -> (bytes, flops)
    streams: Callable[[dict, Operands, Operands], list[Stream]] = no_streams
    prewait: Hook | None = None             # work before the waits (defined in a .cuh it includes)
    # problems with the VALUES of its weight operands, checked once when weights are bound:
    # (params, input operands, input tensors where a weight else None) -> problems
    weight_values: Callable[[dict, Operands, list], list[str]] | None = None
    # the opcode whose device function runs this one too (branching on the opcode where they differ): its
    # inputs and params begin with the host's, so one call site serves both and the kernel's main loop
    # carries one inline copy of the body (a GEMV inlined twice makes the loop spill); "" for its own
    body: str = ""
    # floats of the block's shared activation vector and scratch (xs, MEGAVM_MAX_K of them) the task uses,
    # prologue, body and epilogue together; None (no hook, or the hook's answer for these operands): not
    # stated, and a program holding such a task is built with the whole MAX_K (vm/sizing.py)
    shared: Callable[[dict, Operands, Operands], int | None] | None = None

    def __post_init__(self):
        if not re.fullmatch(r"[A-Z][A-Z0-9_]*", self.name):
            raise ValueError(f"opcode name {self.name!r} must be upper-case letters, digits and _")
        for what, n, cap in (("inputs", len(self.inputs), MAX_INPUTS), ("outputs", len(self.outputs), MAX_OUTPUTS),
                             ("params", len(self.params), MAX_PARAMS)):
            if n > cap:
                raise ValueError(f"{self.name}: {n} {what}; the ABI holds {cap}")
        names = [s.name for s in self.inputs + self.outputs] + [p.name for p in self.params]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"{self.name}: slot and param names must be unique, {dup} repeat")
        slots = {s.name for s in self.inputs + self.outputs}
        for s in self.inputs + self.outputs:
            if s.bound is not None and s.bound[0] not in slots:
                raise ValueError(f"{self.name}: slot {s.name!r} is bounded by unknown slot {s.bound[0]!r}")
        unknown = [a for a in (self.prewait.args if self.prewait else ()) if a not in names]
        if unknown:
            raise ValueError(f"{self.name}: pre-wait hook {self.prewait.fn} takes unknown operands or params {unknown}")

    @property
    def module(self) -> str:
        return self.name.lower()

    @property
    def param_names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.params)

    @property
    def float_params(self) -> frozenset[str]:
        return frozenset(p.name for p in self.params if p.f32)

    def place(self, name: str) -> tuple[str, int]:
        """Where an operand or param lives: ("in" | "out" | "param", index)."""
        for io, items in (("in", self.inputs), ("out", self.outputs), ("param", self.params)):
            for i, x in enumerate(items):
                if x.name == name:
                    return io, i
        raise KeyError(f"{self.name} has no operand or param {name!r}")

    def encode_params(self, params: dict) -> list[int]:
        """Params as MAX_PARAMS uint32 words, in declaration order (f32 params as their bits)."""
        missing = [p for p in self.param_names if p not in params]
        if missing:
            raise ValueError(f"{self.name}: missing params {missing}")
        extra = sorted(set(params) - set(self.param_names))
        if extra:
            raise ValueError(f"{self.name}: unknown params {extra}")
        words = []
        for p in self.params:
            v = params[p.name]
            if p.f32:
                words.append(struct.unpack("<I", struct.pack("<f", float(v)))[0])
            else:
                words.append(int(v) & 0xFFFFFFFF)
        return words + [0] * (MAX_PARAMS - len(words))

    def decode_params(self, words) -> dict:
        out = {}
        for i, p in enumerate(self.params):
            w = int(words[i]) & 0xFFFFFFFF
            if p.f32:
                out[p.name] = struct.unpack("<f", struct.pack("<I", w))[0]
            else:
                out[p.name] = w - (1 << 32) if w >= 1 << 31 else w
        return out


def full(shape) -> Box:
    return tuple((0, s) for s in shape)


def rows(lo: int, hi: int) -> Box:
    return ((lo, hi),)


def need(cond: bool, problems: list[str], msg: str) -> None:
    if not cond:
        problems.append(msg)

