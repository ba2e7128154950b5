"""What every opcode declares once: operands, params, the regions it touches, its torch reference,
the weight bytes the GPU loader streams for it, and its cost.

A box is a tuple of (lo, hi) per buffer axis. The KV position axis of a cache write is declared
whole, since the position is a runtime input; the validator's ordering rules stay sound that way.
"""
from __future__ import annotations

import enum
import struct
from dataclasses import dataclass
from typing import Callable

from schedule.ir import BufferKind, DType

MAX_PARAMS = 12


class Op(enum.IntEnum):
    EMBED = 0
    RMS_LINEAR = 1
    RMS_LINEAR_ROPE = 2
    RMS_LINEAR_KV = 3
    RMS_SWIGLU = 4
    LINEAR_RESIDUAL = 5
    ATTN_PARTIAL = 6
    ATTN_COMBINE = 7
    RMS_LINEAR_ARGMAX = 8
    ARGMAX = 9
    # the unfused forms, for the fusion ablations (schedule/lower.py: LowerConfig.fuse_*)
    RMSNORM = 10
    LINEAR = 11
    ADD = 12
    ROPE = 13
    KV_APPEND = 14


Box = tuple[tuple[int, int], ...]

W = (BufferKind.WEIGHT,)
ACT = (BufferKind.ACTIVATION, BufferKind.OUTPUT)
KV = (BufferKind.KV_CACHE,)
INP = (BufferKind.INPUT,)
FLOAT = (DType.F32, DType.BF16)


@dataclass(frozen=True)
class Slot:
    name: str
    kinds: tuple[BufferKind, ...]
    dtypes: tuple[DType, ...] = FLOAT


@dataclass(frozen=True)
class Access:
    io: str          # "in" | "out"
    slot: int
    box: Box


@dataclass(frozen=True)
class Stream:
    """A contiguous run of one weight operand that the GPU loader copies ahead of the wait."""
    slot: int        # input slot
    elem_offset: int
    elem_count: int


@dataclass(frozen=True)
class OpSpec:
    op: Op
    inputs: tuple[Slot, ...]
    outputs: tuple[Slot, ...]
    params: tuple[str, ...]
    float_params: frozenset[str]
    # check(params, in_shapes, out_shapes) -> list of problems (empty when fine)
    check: Callable[[dict, list, list], list[str]]
    accesses: Callable[[dict, list, list], list[Access]]
    # reference(params, ins, outs): torch tensors, outputs written in place
    reference: Callable[[dict, list, list], None]
    streams: Callable[[dict, list], list[Stream]]
    # cost(params, in_shapes, in_itemsizes) -> (bytes, flops)
    cost: Callable[[dict, list, list], tuple[int, int]]

    @property
    def name(self) -> str:
        return self.op.name

    def encode_params(self, params: dict) -> list[int]:
        """Params as MAX_PARAMS uint32 words, in declaration order (floats as their f32 bits)."""
        missing = [p for p in self.params if p not in params]
        if missing:
            raise ValueError(f"{self.name}: missing params {missing}")
        extra = sorted(set(params) - set(self.params))
        if extra:
            raise ValueError(f"{self.name}: unknown params {extra}")
        words = []
        for p in self.params:
            v = params[p]
            if p in self.float_params:
                words.append(struct.unpack("<I", struct.pack("<f", float(v)))[0])
            else:
                words.append(int(v) & 0xFFFFFFFF)
        return words + [0] * (MAX_PARAMS - len(words))

    def decode_params(self, words) -> dict:
        out = {}
        for i, p in enumerate(self.params):
            w = int(words[i]) & 0xFFFFFFFF
            if p in self.float_params:
                out[p] = struct.unpack("<f", struct.pack("<I", w))[0]
            else:
                out[p] = w - (1 << 32) if w >= 1 << 31 else w
        return out


def full(shape) -> Box:
    return tuple((0, s) for s in shape)


def rows(lo: int, hi: int) -> Box:
    return ((lo, hi),)


def need(cond: bool, problems: list[str], msg: str) -> None:
    if not cond:
        problems.append(msg)
