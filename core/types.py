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
    F8E4M3 = 3          # weights only, each row scaled by its f32 in the buffer named <name>.scale

    @property
    def itemsize(self) -> int:
        return {DType.BF16: 2, DType.F8E4M3: 1}.get(self, 4)

    @property
    def torch(self):
        import torch
        return {DType.F32: torch.float32, DType.BF16: torch.bfloat16, DType.I32: torch.int32,
                DType.F8E4M3: torch.float8_e4m3fn}[self]

    @classmethod
    def parse(cls, name: str) -> "DType":
        try:
            return cls[name.upper()]
        except KeyError:
            raise UserError(f"unknown dtype {name!r}; expected one of {[d.name.lower() for d in cls]}") from None


def scale_name(weight: str) -> str:
    """The buffer that holds an F8E4M3 weight's per-row scales: f32, the weight's shape without its
    last axis (a row r of the weight dequantizes to codes[r] * scale[r])."""
    return weight + ".scale"


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
