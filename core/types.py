"""The scalar types of programs: what a buffer is for (kind) and how its elements are stored (dtype)."""
from __future__ import annotations

import enum
from dataclasses import dataclass

from megavm.core.errors import UserError


class BufferKind(enum.IntEnum):
    WEIGHT = 0
    ACTIVATION = 1
    KV_CACHE = 2
    INPUT = 3
    OUTPUT = 4


class DType(enum.IntEnum):
    F32 = 0
    BF16 = 1
    I32 = 2

    @property
    def itemsize(self) -> int:
        return 2 if self is DType.BF16 else 4

    @property
    def torch(self):
        import torch
        return {DType.F32: torch.float32, DType.BF16: torch.bfloat16, DType.I32: torch.int32}[self]

    @classmethod
    def parse(cls, name: str) -> "DType":
        try:
            return cls[name.upper()]
        except KeyError:
            raise UserError(f"unknown dtype {name!r}; expected one of {[d.name.lower() for d in cls]}") from None


@dataclass(frozen=True)
class Buffer:
    name: str
    kind: BufferKind
    dtype: DType
    shape: tuple[int, ...]

    @property
    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n

    @property
    def nbytes(self) -> int:
        return self.numel * self.dtype.itemsize
