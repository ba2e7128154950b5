"""The validator's rule for weights stored in a packed format (rule `weight_scales`): each format's
codes come with the scale tables the GEMV reads beside them, of the shapes it reads them in.

- F8E4M3: rows of whole 16-byte pieces, with f32 row scales `<name>.scale` [...], or (fp8-block) f32
  scales per 128 x 128 block `<name>.block_scale` [..., ceil(rows/128), ceil(K/128)], never both; a
  stack's matrices are whole blocks of 128 rows. An F8E4M3 KV cache is a quantized cache: only
  KV_QUANT writes its e4m3 rows, with their scales, and ATTN_PARTIAL reads them with those (the
  opcodes' slot and shape checks hold it).
- E2M1: rows of whole 16-byte pieces (32 codes); nvfp4: f32 row scales and e4m3 block scales
  `<name>.block_scale` [..., K/16]; mxfp4: E8M0 exponents `<name>.block_scale` [..., K/32] and no row
  scales.
- U4 (int4): rows of whole groups of 128 codes, an F16 group table `<name>.block_scale`
  [..., K/128, 2] (scale, zero point), no row scales.
- F16 and E8M0 hold nothing but U4 group tables and mxfp4 exponents.
"""
from __future__ import annotations

from typing import Iterator

from megavm.core.types import U4_GROUP, BufferKind, DType, block_scale_name, scale_name

CODE = {DType.F8E4M3: "e4m3", DType.E2M1: "e2m1", DType.U4: "int4"}
PIECE = {DType.F8E4M3: 16, DType.E2M1: 32, DType.U4: U4_GROUP}     # codes a row is a whole number of
TABLES = {DType.F16: "group table of an int4 (U4) weight", DType.E8M0: "block exponents of an mxfp4 (E2M1) weight"}


def weight_scales(f) -> Iterator[str]:
    """The module docstring's rule over every buffer of f.p (f: the validator's Facts)."""
    names = f.p._names()
    tables = {block_scale_name(buf.name) for buf in f.p.buffers if buf.dtype in (DType.E2M1, DType.U4)}

    def expect(b: int, what: str, name: str, dtype: DType, shape: tuple) -> Iterator[str]:
        s = names.get(name)
        if s is None:
            yield f"{f.buf(b)} is {f.p.buffers[b].dtype.name} but no buffer {name!r} holds its {what}"
        elif (f.p.buffers[s].kind, f.p.buffers[s].dtype, f.p.buffers[s].shape) != (BufferKind.WEIGHT, dtype, shape):
            sb = f.p.buffers[s]
            yield (f"{f.buf(s)}, the {what} of {f.buf(b)}, is a {sb.kind.name} {sb.dtype.name} of shape "
                   f"{sb.shape}; expected a {dtype.name} WEIGHT of shape {shape}")

    def table_dtype(buf) -> DType | None:
        s = names.get(block_scale_name(buf.name))
        return None if s is None else f.p.buffers[s].dtype

    for b, buf in enumerate(f.p.buffers):
        if buf.name in tables or buf.dtype not in (*CODE, *TABLES):
            continue
        if buf.dtype in TABLES:
            yield f"{f.buf(b)} is {buf.dtype.name}, which megavm stores only as the {TABLES[buf.dtype]}"
            continue
        if buf.kind == BufferKind.KV_CACHE and buf.dtype in (DType.F8E4M3, DType.E2M1):
            continue                             # a quantized cache: KV_QUANT writes it, its scales beside it
        if buf.kind != BufferKind.WEIGHT:
            yield (f"{f.buf(b)} is {buf.dtype.name} but of kind {buf.kind.name}: only weights are stored in "
                   f"{CODE[buf.dtype]}")
            continue
        k = buf.shape[-1]
        if k % PIECE[buf.dtype]:
            yield (f"{f.buf(b)} is {buf.dtype.name} with rows of {k} codes; the GEMV reads {CODE[buf.dtype]} rows "
                   + (f"in groups of {U4_GROUP} codes" if buf.dtype == DType.U4 else
                      f"in whole 16-byte pieces (a multiple of {PIECE[buf.dtype]})"))
            continue
        table, rows_scaled = block_scale_name(buf.name), scale_name(buf.name) in names
        if buf.dtype == DType.U4:
            yield from expect(b, "group scales and zero points", table, DType.F16, (*buf.shape[:-1], k // U4_GROUP, 2))
        elif buf.dtype == DType.F8E4M3 and table in names:          # fp8-block
            rows = buf.shape[-2] if len(buf.shape) >= 2 else 1
            if len(buf.shape) > 2 and rows % 128:
                yield (f"{f.buf(b)} is a stack of e4m3 matrices of {rows} rows with 128 x 128 block scales; the GEMV "
                       f"needs each matrix in whole blocks of 128 rows")
            yield from expect(b, "128 x 128 block scales", table, DType.F32,
                              (*buf.shape[:-2], -(-rows // 128), -(-k // 128)))
            if rows_scaled:
                yield f"{f.buf(b)} has both row scales and 128 x 128 block scales; an e4m3 weight takes one of them"
        elif buf.dtype == DType.E2M1 and table_dtype(buf) == DType.E8M0:    # mxfp4
            yield from expect(b, "e8m0 block exponents", table, DType.E8M0, (*buf.shape[:-1], k // 32))
            if rows_scaled:
                yield f"{f.buf(b)} has e8m0 block exponents and row scales; an mxfp4 weight takes no row scales"
        else:                                                       # fp8 (row scales), nvfp4
            yield from expect(b, "row scales", scale_name(buf.name), DType.F32, buf.shape[:-1])
            if buf.dtype == DType.E2M1:
                yield from expect(b, "block scales", table, DType.F8E4M3, (*buf.shape[:-1], k // 16))
