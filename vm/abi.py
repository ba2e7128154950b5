"""The packed program's layout as numpy structured dtypes: the Python side of vm/abi.h.

tests/vm/test_abi.py compiles abi.h with the C compiler and checks every size, offset, constant and
enum code below against it.
"""
import numpy as np

from instructions import MAX_INPUTS, MAX_OUTPUTS, MAX_PARAMS, MAX_STREAMS, Op
from instructions.common import MAX_K, MAX_TILE_ROWS
from schedule.ir import BufferKind, DType

MAGIC = 0x4D56474D
ABI_VERSION = 2                 # 2: the norm param of the RMS_* opcodes; opcodes 10-14
MAX_WAITS = 4
MAX_DIMS = 4

CONSTANTS = {
    "MEGAVM_MAGIC": MAGIC, "MEGAVM_ABI_VERSION": ABI_VERSION, "MEGAVM_MAX_INPUTS": MAX_INPUTS,
    "MEGAVM_MAX_OUTPUTS": MAX_OUTPUTS, "MEGAVM_MAX_WAITS": MAX_WAITS, "MEGAVM_MAX_PARAMS": MAX_PARAMS,
    "MEGAVM_MAX_STREAMS": MAX_STREAMS, "MEGAVM_MAX_DIMS": MAX_DIMS, "MEGAVM_MAX_TILE_ROWS": MAX_TILE_ROWS,
    "MEGAVM_MAX_K": MAX_K,
}


class Status:
    OK = 0
    WAIT_TIMEOUT = 1
    BAD_OPCODE = 2
    BAD_INPUT = 3
    ABORTED = 4


ENUMS = {f"MVM_OP_{op.name}": int(op) for op in Op}
ENUMS["MVM_OP_COUNT"] = len(Op)
ENUMS.update({f"MVM_{k.name}": int(k) for k in BufferKind})
ENUMS.update({f"MVM_{d.name}": int(d) for d in DType})
ENUMS.update({"MVM_OK": Status.OK, "MVM_ERR_WAIT_TIMEOUT": Status.WAIT_TIMEOUT, "MVM_ERR_BAD_OPCODE": Status.BAD_OPCODE,
              "MVM_ERR_BAD_INPUT": Status.BAD_INPUT, "MVM_ERR_ABORTED": Status.ABORTED})


def _struct(fields, itemsize):
    names, formats, offsets = [], [], []
    off = 0
    for name, *fmt in fields:
        fmt = fmt[0] if len(fmt) == 1 else tuple(fmt)
        dt = np.dtype(fmt)
        align = dt.base.alignment if dt.base.fields is None else max(
            dt.base.fields[f][0].alignment for f in dt.base.names)
        off = (off + align - 1) // align * align
        names.append(name)
        formats.append(fmt)
        offsets.append(off)
        off += dt.itemsize
    return np.dtype({"names": names, "formats": formats, "offsets": offsets, "itemsize": itemsize})


HEADER = _struct([("magic", "<u4"), ("abi_version", "<u4"), ("n_buffers", "<u4"), ("n_counters", "<u4"),
                  ("n_instrs", "<u4"), ("n_queues", "<u4"), ("n_entries", "<u4"), ("flags", "<u4"),
                  ("buffers_offset", "<u8"), ("instrs_offset", "<u8"), ("counters_offset", "<u8"),
                  ("queue_offsets_offset", "<u8"), ("queue_entries_offset", "<u8"), ("names_offset", "<u8"),
                  ("arena_bytes", "<u8"), ("total_bytes", "<u8")], 96)

BUFFER = _struct([("kind", "u1"), ("dtype", "u1"), ("ndim", "u1"), ("pad0", "u1"), ("name_offset", "<u4"),
                  ("shape", "<i8", (MAX_DIMS,)), ("nbytes", "<u8"), ("arena_offset", "<u8")], 56)

WAIT = _struct([("counter", "<i4"), ("threshold", "<u4")], 8)

STREAM = _struct([("buffer", "<i4"), ("pad0", "<u4"), ("byte_offset", "<u8"), ("byte_count", "<u8")], 24)

INSTR = _struct([("opcode", "<u2"), ("n_inputs", "u1"), ("n_outputs", "u1"), ("n_waits", "u1"), ("n_streams", "u1"),
                 ("pad0", "<u2"), ("signal", "<i4"), ("task", "<u4"), ("inputs", "<i4", (MAX_INPUTS,)),
                 ("outputs", "<i4", (MAX_OUTPUTS,)), ("pad1", "<i4"), ("waits", WAIT, (MAX_WAITS,)),
                 ("params", "<u4", (MAX_PARAMS,)), ("streams", STREAM, (MAX_STREAMS,))], 176)

ERROR = _struct([("status", "<u4"), ("block", "<u4"), ("instr", "<u4"), ("task", "<u4"), ("opcode", "<u4"),
                 ("counter", "<i4"), ("value", "<u4"), ("target", "<u4")], 32)

STRUCTS = {"mvm_header_t": HEADER, "mvm_buffer_t": BUFFER, "mvm_wait_t": WAIT, "mvm_stream_t": STREAM,
           "mvm_instr_t": INSTR, "mvm_error_t": ERROR}
