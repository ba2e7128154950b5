"""The packed program's layout and the launch arguments as numpy structured dtypes: the Python side
of core/abi.h.

tests/core/test_abi.py compiles abi.h with the C compiler and checks every size, offset, constant and
enum code below against it.
"""
import enum

import numpy as np

from megavm.core.types import BufferKind, DType

MAGIC = 0x4D56474D
ABI_VERSION = 16                # 16: the last weight stage (instruction flag INSTR_LAST_STAGE); 15: relaxed signals (instruction flag INSTR_SIGNAL_RELAXED); 14: three outputs (KV_QUANT appends an NVFP4 cache: codes, row scales, block scales); 13: tagged buffers (buffer flag BUFFER_TAGGED) and polled waits (INSTR_POLLED_WAIT0 << j), status TAG_TIMEOUT; 12: E8M0 block scales (MXFP4 weights without row scales); 11: U4 (AWQ int4) weights with F16 group tables (block_scale); 10: E2M1 (NVFP4) weights with block scales (buffer field block_scale); 9: inline tasks (instruction flag INSTR_INLINE, args.inline_of); 8: KV history streams (the loader copies attention's K/V rows); 7: F8E4M3 weights with per-row scales; 6: late-bound (indexed) weight streams; 5: twelve inputs (LoRA operands); 4: optional slots, family params
MAX_INPUTS = 12
MAX_OUTPUTS = 3
MAX_WAITS = 4
MAX_PARAMS = 12
MAX_STREAMS = 2
MAX_DIMS = 4

CONSTANTS = {
    "MEGAVM_MAGIC": MAGIC, "MEGAVM_ABI_VERSION": ABI_VERSION, "MEGAVM_MAX_INPUTS": MAX_INPUTS,
    "MEGAVM_MAX_OUTPUTS": MAX_OUTPUTS, "MEGAVM_MAX_WAITS": MAX_WAITS, "MEGAVM_MAX_PARAMS": MAX_PARAMS,
    "MEGAVM_MAX_STREAMS": MAX_STREAMS, "MEGAVM_MAX_DIMS": MAX_DIMS, "MEGAVM_STREAM_HISTORY": -2,
    "MEGAVM_INSTR_INLINE": 1, "MEGAVM_INSTR_SIGNALS_INLINE": 2, "MEGAVM_INSTR_POLLED_WAIT0": 4,
    "MEGAVM_INSTR_SIGNAL_RELAXED": 64, "MEGAVM_INSTR_LAST_STAGE": 128, "MEGAVM_BUFFER_TAGGED": 1,
}
INSTR_INLINE = CONSTANTS["MEGAVM_INSTR_INLINE"]   # instruction flag: in no queue, run by its last signaller
INSTR_SIGNALS_INLINE = CONSTANTS["MEGAVM_INSTR_SIGNALS_INLINE"]   # its signal's counter has an inline waiter
INSTR_POLLED_WAIT0 = CONSTANTS["MEGAVM_INSTR_POLLED_WAIT0"]   # << j: wait j is met by polling tagged inputs
INSTR_SIGNAL_RELAXED = CONSTANTS["MEGAVM_INSTR_SIGNAL_RELAXED"]   # no GPU wait acquires its signal's counter
INSTR_LAST_STAGE = CONSTANTS["MEGAVM_INSTR_LAST_STAGE"]   # streams weights, and no task after it does
BUFFER_TAGGED = CONSTANTS["MEGAVM_BUFFER_TAGGED"]   # buffer flag: (value, tag) words


class Status(enum.IntEnum):
    OK = 0
    WAIT_TIMEOUT = 1
    BAD_OPCODE = 2
    BAD_INPUT = 3
    ABORTED = 4
    TAG_TIMEOUT = 5


class Flag(enum.IntFlag):
    """Launch flags: the runtime ablations (vm.megakernel.Ablations)."""
    DIRECT_LOADS = 1                # consumers load weights themselves, after the wait (no ring)
    NO_ATTN_HISTORY = 2             # attention reads every K/V row from L2 after its wait
    WEIGHTS_EVICT_NORMAL = 4        # weight copies without the L2 evict-first hint


ENUMS = {f"MVM_{k.name}": int(k) for k in BufferKind}
ENUMS.update({f"MVM_{d.name}": int(d) for d in DType})
ENUMS.update({("MVM_OK" if s is Status.OK else f"MVM_ERR_{s.name}"): int(s) for s in Status})
ENUMS.update({f"MVM_FLAG_{f.name}": int(f) for f in Flag})


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
                  ("n_instrs", "<u4"), ("n_queues", "<u4"), ("n_entries", "<u4"), ("pad0", "<u4"),
                  ("buffers_offset", "<u8"), ("instrs_offset", "<u8"), ("counters_offset", "<u8"),
                  ("queue_offsets_offset", "<u8"), ("queue_entries_offset", "<u8"), ("names_offset", "<u8"),
                  ("arena_bytes", "<u8"), ("total_bytes", "<u8")], 96)

BUFFER = _struct([("kind", "u1"), ("dtype", "u1"), ("ndim", "u1"), ("flags", "u1"), ("name_offset", "<u4"),
                  ("shape", "<i8", (MAX_DIMS,)), ("nbytes", "<u8"), ("arena_offset", "<u8"), ("scale", "<i4"),
                  ("block_scale", "<i4")], 64)

WAIT = _struct([("counter", "<i4"), ("threshold", "<u4")], 8)

STREAM = _struct([("buffer", "<i4"), ("index_slot", "i1"), ("index_wait", "u1"), ("index_first", "u1"),
                  ("index_count", "u1"), ("byte_offset", "<u8"), ("byte_count", "<u8")], 24)
NO_INDEX = -1                   # mvm_stream_t.index_slot of a stream whose address is fixed
STREAM_HISTORY = CONSTANTS["MEGAVM_STREAM_HISTORY"]  # mvm_stream_t.index_slot of a KV history stream (abi.h)
# A history stream's sliding window: index_first holds its low byte, index_count its high one (0: none)
STREAM_WINDOW_MAX = (1 << 8 * (STREAM["index_first"].itemsize + STREAM["index_count"].itemsize)) - 1


def stream_window(window: int) -> tuple[int, int]:
    """(index_first, index_count) of a history stream's window (at most STREAM_WINDOW_MAX)."""
    if not 0 <= window <= STREAM_WINDOW_MAX:
        raise ValueError(f"a history stream's window is 0..{STREAM_WINDOW_MAX}, not {window}")
    return window & 0xFF, window >> 8

INSTR = _struct([("opcode", "<u2"), ("n_inputs", "u1"), ("n_outputs", "u1"), ("n_waits", "u1"), ("n_streams", "u1"),
                 ("flags", "<u2"), ("signal", "<i4"), ("task", "<u4"), ("inputs", "<i4", (MAX_INPUTS,)),
                 ("outputs", "<i4", (MAX_OUTPUTS,)), ("waits", WAIT, (MAX_WAITS,)),
                 ("params", "<u4", (MAX_PARAMS,)), ("reserved", "<u4"), ("streams", STREAM, (MAX_STREAMS,))], 208)

ERROR = _struct([("status", "<u4"), ("block", "<u4"), ("instr", "<u4"), ("task", "<u4"), ("opcode", "<u4"),
                 ("counter", "<i4"), ("value", "<u4"), ("target", "<u4")], 32)

# pointers travel as u8 device addresses
ARGS = _struct([("instrs", "<u8"), ("buffers", "<u8"), ("queue_offsets", "<u8"), ("queue_entries", "<u8"),
                ("producers", "<u8"), ("ptrs", "<u8"), ("counters", "<u8"), ("error", "<u8"), ("trace", "<u8"),
                ("timeout_ns", "<u8"), ("epoch", "<u4"), ("flags", "<u4"), ("seq", "<u8"), ("n_steps", "<u4"),
                ("n_prompt", "<u4"), ("step_counter", "<i4"), ("token", "<i4"), ("pos", "<i4"), ("pad0", "<u4"),
                ("inline_of", "<u8")], 128)

STRUCTS = {"mvm_header_t": HEADER, "mvm_buffer_t": BUFFER, "mvm_wait_t": WAIT, "mvm_stream_t": STREAM,
           "mvm_instr_t": INSTR, "mvm_error_t": ERROR, "mvm_args_t": ARGS}
