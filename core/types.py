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
    E2M1 = 4            # NVFP4 weights, two codes a byte, element 2i in the low nibble; each block of 16 scaled by
    #                     its e4m3 in <name>.block_scale, each row by its f32 in <name>.scale. Also an NVFP4 KV
    #                     cache's codes (its scales in KV_QUANT's outputs, instructions/kv_quant.py)
    U4 = 5              # weights only (AWQ int4), two codes 0..15 a byte, element 2i in the low nibble; element k
    #                     of row r is (code - zero) * scale, (scale, zero) = <name>.block_scale[r, k // 128]
    F16 = 6             # an int4 weight's group table (<name>.block_scale: scale and zero point per group)
    E8M0 = 7            # an MXFP4 weight's block scales (<name>.block_scale: a biased exponent byte per 32 codes,
    #                     2^(e - 127); 255 is NaN)

    @property
    def nibbles(self) -> bool:
        """Two codes a byte (E2M1, U4): rows of K codes are K / 2 bytes."""
        return self in (DType.E2M1, DType.U4)

    @property
    def itemsize(self) -> float:
        """Bytes per element (E2M1, U4: half of one)."""
        return {DType.BF16: 2, DType.F16: 2, DType.F8E4M3: 1, DType.E8M0: 1, DType.E2M1: 0.5, DType.U4: 0.5}.get(self, 4)

    @property
    def torch(self):
        """The torch dtype of the stored tensor (E2M1, U4: its bytes, uint8, see storage_shape)."""
        import torch
        return {DType.F32: torch.float32, DType.BF16: torch.bfloat16, DType.I32: torch.int32,
                DType.F8E4M3: torch.float8_e4m3fn, DType.E2M1: torch.uint8, DType.U4: torch.uint8,
                DType.F16: torch.float16, DType.E8M0: torch.uint8}[self]

    def storage_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        """The stored tensor's shape for a buffer of this shape (E2M1, U4: the last axis in bytes)."""
        return tuple(shape[:-1]) + (shape[-1] // 2,) if self.nibbles else tuple(shape)

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


def block_scale_name(weight: str) -> str:
    """The buffer that holds an E2M1 weight's block scales: e4m3, the weight's shape with its last axis
    in blocks of 16 (element k of row r dequantizes to code * block_scale[r, k // 16] * scale[r]), or
    with mxfp4 e8m0 exponents per 32 and no row scales (code * 2^(block_scale[r, k // 32] - 127)); or a
    U4 weight's group table: f16, the weight's shape with its last axis in groups of 128, then (scale,
    zero) (element k of row r dequantizes to (code - zero) * scale of group [r, k // 128])."""
    return weight + ".block_scale"


U4_GROUP = 128       # codes per (scale, zero) pair of a U4 weight's row (AWQ's group size)


@dataclass(frozen=True)
class Buffer:
    name: str
    kind: BufferKind
    dtype: DType
    shape: tuple[int, ...]
    tagged: bool = False    # an f32 activation stored as (value, tag) words: docs/ir.md, "Tagged hand-offs"

    @property
    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n

    @property
    def nbytes(self) -> int:
        return int(self.numel * self.dtype.itemsize) * (2 if self.tagged else 1)
