// megavm ABI: the packed program's tables, shared by the host (vm/abi.py) and the megakernel.
// vm/abi.py holds the same layout as numpy dtypes; tests/vm/test_abi.py compiles this header and
// compares every size, offset and enum code with it.
#pragma once
#include <stdint.h>

#define MEGAVM_MAGIC 0x4D56474Du  /* "MGVM" */
#define MEGAVM_ABI_VERSION 2u

#define MEGAVM_MAX_INPUTS 5
#define MEGAVM_MAX_OUTPUTS 2
#define MEGAVM_MAX_WAITS 4
#define MEGAVM_MAX_PARAMS 12
#define MEGAVM_MAX_STREAMS 2
#define MEGAVM_MAX_DIMS 4
#define MEGAVM_MAX_TILE_ROWS 256
#define MEGAVM_MAX_K 16384

enum mvm_opcode {
  MVM_OP_EMBED = 0,
  MVM_OP_RMS_LINEAR = 1,
  MVM_OP_RMS_LINEAR_ROPE = 2,
  MVM_OP_RMS_LINEAR_KV = 3,
  MVM_OP_RMS_SWIGLU = 4,
  MVM_OP_LINEAR_RESIDUAL = 5,
  MVM_OP_ATTN_PARTIAL = 6,
  MVM_OP_ATTN_COMBINE = 7,
  MVM_OP_RMS_LINEAR_ARGMAX = 8,
  MVM_OP_ARGMAX = 9,
  MVM_OP_RMSNORM = 10,
  MVM_OP_LINEAR = 11,
  MVM_OP_ADD = 12,
  MVM_OP_ROPE = 13,
  MVM_OP_KV_APPEND = 14,
  MVM_OP_COUNT = 15
};

enum mvm_buffer_kind { MVM_WEIGHT = 0, MVM_ACTIVATION = 1, MVM_KV_CACHE = 2, MVM_INPUT = 3, MVM_OUTPUT = 4 };
enum mvm_dtype { MVM_F32 = 0, MVM_BF16 = 1, MVM_I32 = 2 };

enum mvm_status {
  MVM_OK = 0,
  MVM_ERR_WAIT_TIMEOUT = 1,
  MVM_ERR_BAD_OPCODE = 2,
  MVM_ERR_BAD_INPUT = 3,
  MVM_ERR_ABORTED = 4
};

typedef struct {
  uint32_t magic;
  uint32_t abi_version;
  uint32_t n_buffers;
  uint32_t n_counters;
  uint32_t n_instrs;
  uint32_t n_queues;
  uint32_t n_entries;       // total queue entries
  uint32_t flags;
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
  uint8_t pad0;
  uint32_t name_offset;     // into the names table, NUL-terminated
  int64_t shape[MEGAVM_MAX_DIMS];
  uint64_t nbytes;
  uint64_t arena_offset;    // ACTIVATION / OUTPUT only
} mvm_buffer_t;

typedef struct {
  int32_t counter;
  uint32_t threshold;       // per step; step e waits for threshold + e * producers(counter)
} mvm_wait_t;

typedef struct {
  int32_t buffer;           // a WEIGHT buffer
  uint32_t pad0;
  uint64_t byte_offset;
  uint64_t byte_count;
} mvm_stream_t;

typedef struct {
  uint16_t opcode;
  uint8_t n_inputs;
  uint8_t n_outputs;
  uint8_t n_waits;
  uint8_t n_streams;
  uint16_t pad0;
  int32_t signal;           // counter incremented when done, -1 for none
  uint32_t task;            // index in the program (for dumps and traces)
  int32_t inputs[MEGAVM_MAX_INPUTS];
  int32_t outputs[MEGAVM_MAX_OUTPUTS];
  int32_t pad1;
  mvm_wait_t waits[MEGAVM_MAX_WAITS];
  uint32_t params[MEGAVM_MAX_PARAMS];
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

#ifdef __cplusplus
static_assert(sizeof(mvm_header_t) == 96, "mvm_header_t");
static_assert(sizeof(mvm_buffer_t) == 56, "mvm_buffer_t");
static_assert(sizeof(mvm_wait_t) == 8, "mvm_wait_t");
static_assert(sizeof(mvm_stream_t) == 24, "mvm_stream_t");
static_assert(sizeof(mvm_instr_t) == 176, "mvm_instr_t");
static_assert(sizeof(mvm_error_t) == 32, "mvm_error_t");
static_assert(MVM_OP_COUNT == 15, "opcode count: add the opcode to every per-opcode table");
#endif
