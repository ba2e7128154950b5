// megavm ABI: the packed program's tables and the launch arguments, shared by the host
// (core/abi.py) and the megakernel. core/abi.py holds the same layout as numpy dtypes;
// tests/core/test_abi.py compiles this header and compares every size, offset and enum code with it.
// Opcodes and their params are not here: instructions/opcodes.cuh is generated from the specs.
#pragma once
#include <stddef.h>
#include <stdint.h>

#define MEGAVM_MAGIC 0x4D56474Du  /* "MGVM" */
#define MEGAVM_ABI_VERSION 16u

#define MEGAVM_MAX_INPUTS 12
#define MEGAVM_MAX_OUTPUTS 3
#define MEGAVM_MAX_WAITS 4
#define MEGAVM_MAX_PARAMS 12
#define MEGAVM_MAX_STREAMS 2
#define MEGAVM_MAX_DIMS 4
#define MEGAVM_STREAM_HISTORY (-2)
#define MEGAVM_INSTR_INLINE 1u      /* mvm_instr_t.flags: run by the task whose signal completes its one wait */
#define MEGAVM_INSTR_SIGNALS_INLINE 2u  /* mvm_instr_t.flags: its signal's counter has an inline waiter */
#define MEGAVM_INSTR_POLLED_WAIT0 4u  /* mvm_instr_t.flags: (this << j) set: wait j is met by polling the tags of
                                         the instruction's tagged inputs, not its counter (docs/ir.md) */
#define MEGAVM_INSTR_SIGNAL_RELAXED 64u  /* mvm_instr_t.flags: no wait on the GPU acquires its signal's counter (every
                                            wait on it is polled; no stream or inline task waits on it): a relaxed
                                            increment, no release (vm/pack.py) */
#define MEGAVM_INSTR_LAST_STAGE 128u  /* mvm_instr_t.flags: it streams weights and no task that waits on it, directly
                                         or through others, streams any: the loader keeps MVM_LAST_INFLIGHT copies
                                         in flight for it (vm/pack.py: last_stage) */
#define MEGAVM_BUFFER_TAGGED 1u     /* mvm_buffer_t.flags: f32 values stored as (value, tag) 8-byte words */

enum mvm_buffer_kind { MVM_WEIGHT = 0, MVM_ACTIVATION = 1, MVM_KV_CACHE = 2, MVM_INPUT = 3, MVM_OUTPUT = 4 };
enum mvm_dtype { MVM_F32 = 0, MVM_BF16 = 1, MVM_I32 = 2, MVM_F8E4M3 = 3, MVM_E2M1 = 4, MVM_U4 = 5, MVM_F16 = 6, MVM_E8M0 = 7 };

enum mvm_status {
  MVM_OK = 0,
  MVM_ERR_WAIT_TIMEOUT = 1,
  MVM_ERR_BAD_OPCODE = 2,
  MVM_ERR_BAD_INPUT = 3,
  MVM_ERR_ABORTED = 4,
  MVM_ERR_TAG_TIMEOUT = 5             // a tagged input's word kept an old tag (counter: its buffer)
};

// Launch flags: the runtime ablations (vm/megakernel.py: Ablations).
enum mvm_flag {
  MVM_FLAG_DIRECT_LOADS = 1,          // consumers load weights themselves, after the wait (no ring)
  MVM_FLAG_NO_ATTN_HISTORY = 2,       // attention reads every K/V row from L2 after its wait
  MVM_FLAG_WEIGHTS_EVICT_NORMAL = 4   // weight copies without the L2 evict-first hint
};

typedef struct {
  uint32_t magic;
  uint32_t abi_version;
  uint32_t n_buffers;
  uint32_t n_counters;
  uint32_t n_instrs;
  uint32_t n_queues;
  uint32_t n_entries;       // total queue entries
  uint32_t pad0;
  uint64_t buffers_offset;  // byte offsets of each table from the start of the blob
  uint64_t instrs_offset;
  uint64_t counters_offset;
  uint64_t queue_offsets_offset;
  uint64_t queue_entries_offset;
  uint64_t names_offset;
  uint64_t arena_bytes;     // activations and outputs, one allocation
  uint64_t total_bytes;
} mvm_header_t;

typedef struct {
  uint8_t kind;             // mvm_buffer_kind
  uint8_t dtype;            // mvm_dtype
  uint8_t ndim;
  uint8_t flags;            // MEGAVM_BUFFER_TAGGED
  uint32_t name_offset;     // into the names table, NUL-terminated
  int64_t shape[MEGAVM_MAX_DIMS];
  uint64_t nbytes;
  uint64_t arena_offset;    // ACTIVATION / OUTPUT only
  int32_t scale;            // an F8E4M3 or E2M1 weight: the buffer of its f32 scale per row (shape[:-1]); else -1
  int32_t block_scale;      // an E2M1 weight: the buffer of its e4m3 scale per 16 codes ([..., K/16]), or of its e8m0
                            // exponent per 32 (MXFP4, [..., K/32], no row scales); a U4 weight:
                            // its f16 (scale, zero) per 128 codes ([..., K/128, 2]); else -1
} mvm_buffer_t;

typedef struct {
  int32_t counter;
  uint32_t threshold;       // per step; step e waits for threshold + e * producers(counter)
} mvm_wait_t;

// A weight range the loader copies. A late-bound stream (index_slot >= 0) is index_count ranges, one
// per expert id ids[index_first + j] (ids: the instruction's input index_slot, an i32 vector written
// by the producers of its wait index_wait): range j starts at byte id * (nbytes / shape[0]) +
// byte_offset of the buffer. The loader waits on that wait before it reads the ids.
// A history stream (index_slot == MEGAVM_STREAM_HISTORY) is a run of rows [k0, k1) of one head of a
// KV cache [heads, capacity, head_dim] (byte_offset and byte_count name the run): at position pos
// the loader copies only the rows of keys [max(k0, pos - window + 1), min(k1, pos)), which earlier
// steps wrote (window = index_first | index_count << 8; 0: none), in pieces of whole rows, once the
// wait index_wait of the step before is met.
typedef struct {
  int32_t buffer;           // a WEIGHT buffer
  int8_t index_slot;        // -1: a fixed range; MEGAVM_STREAM_HISTORY: a KV history run
  uint8_t index_wait;
  uint8_t index_first;
  uint8_t index_count;
  uint64_t byte_offset;
  uint64_t byte_count;      // of each range
} mvm_stream_t;

typedef struct {
  uint16_t opcode;
  uint8_t n_inputs;
  uint8_t n_outputs;
  uint8_t n_waits;
  uint8_t n_streams;
  uint16_t flags;           // MEGAVM_INSTR_INLINE, _SIGNALS_INLINE, _POLLED_WAIT0 << j, _SIGNAL_RELAXED, _LAST_STAGE
  int32_t signal;           // counter incremented when done, -1 for none
  uint32_t task;            // index in the program (for dumps and traces)
  int32_t inputs[MEGAVM_MAX_INPUTS];        // buffer ids in the spec's slot order; -1: an optional slot left empty
  int32_t outputs[MEGAVM_MAX_OUTPUTS];
  mvm_wait_t waits[MEGAVM_MAX_WAITS];
  uint32_t params[MEGAVM_MAX_PARAMS];
  uint32_t reserved;        // zero: keeps streams 8-byte aligned with no unnamed padding (tables round-trip as bytes)
  mvm_stream_t streams[MEGAVM_MAX_STREAMS];  // weight bytes the loader copies ahead of the waits
} mvm_instr_t;

typedef struct {
  uint32_t status;          // mvm_status; non-zero aborts every block
  uint32_t block;
  uint32_t instr;           // queue position in that block
  uint32_t task;
  uint32_t opcode;
  int32_t counter;
  uint32_t value;
  uint32_t target;
} mvm_error_t;

// The kernel's launch arguments, passed by value. Step s of a launch decodes seq[s] at position
// pos + s (the in-kernel token loop, vm/loop.py); with seq null (n_steps == 1) step 0 decodes token.
// Its ARGMAX writes seq[s + 1] once s + 1 >= n_prompt.
typedef struct {
  const mvm_instr_t* instrs;
  const mvm_buffer_t* buffers;
  const uint32_t* queue_offsets;
  const uint32_t* queue_entries;
  const uint32_t* producers;          // signals per step, per counter
  void* const* ptrs;                  // device pointer of every buffer
  uint32_t* counters;
  mvm_error_t* error;
  unsigned long long* trace;          // [n_instrs][4]: start, waited, end (ns), block; or null
  unsigned long long timeout_ns;
  uint32_t epoch;                     // absolute step number of this launch's first step
  uint32_t flags;                     // mvm_flag
  int32_t* seq;
  uint32_t n_steps;
  uint32_t n_prompt;
  int32_t step_counter;               // signalled by the step's last task; roots of step s wait for it
  int32_t token;                      // runtime inputs, by value (checked on the host)
  int32_t pos;
  uint32_t pad0;
  const int32_t* inline_of;           // per counter: the inline instruction its last signal runs, or -1
} mvm_args_t;

#ifdef __cplusplus
static_assert(sizeof(mvm_header_t) == 96, "mvm_header_t");
static_assert(sizeof(mvm_buffer_t) == 64, "mvm_buffer_t");
static_assert(sizeof(mvm_wait_t) == 8, "mvm_wait_t");
static_assert(sizeof(mvm_stream_t) == 24, "mvm_stream_t");
static_assert(sizeof(mvm_instr_t) == 208, "mvm_instr_t");
static_assert(offsetof(mvm_instr_t, waits) == 76 && offsetof(mvm_instr_t, params) == 108 &&
              offsetof(mvm_instr_t, streams) == 160, "mvm_instr_t layout");
static_assert(sizeof(mvm_error_t) == 32, "mvm_error_t");
static_assert(sizeof(mvm_args_t) == 128, "mvm_args_t");
static_assert(offsetof(mvm_args_t, timeout_ns) == 72 && offsetof(mvm_args_t, seq) == 88 &&
              offsetof(mvm_args_t, token) == 108 && offsetof(mvm_args_t, inline_of) == 120, "mvm_args_t layout");
#endif
