// The megakernel: one persistent cooperative block per SM. Each block's loader warp streams the
// weights of its queue into the shared-memory ring; its consumer warps walk the same queue:
// wait on the instruction's counters, run the opcode, then fence and signal.
#include "device.cuh"
#include "gemv.cuh"
#include "../../instructions/embed.cuh"
#include "../../instructions/rms_linear.cuh"
#include "../../instructions/rope.cuh"
#include "../../instructions/kv_append.cuh"
#include "../../instructions/swiglu.cuh"
#include "../../instructions/residual.cuh"
#include "../../instructions/attention.cuh"
#include "../../instructions/lm_head.cuh"
#include "../../instructions/norm.cuh"

static_assert(MVM_OP_COUNT == 15, "dispatch below must handle every opcode");
static_assert(sizeof(mvm_smem) <= 227 * 1024, "shared memory over the sm_90 limit");

__device__ __forceinline__ bool dispatch(mvm_ctx& c) {
  switch (c.ins->opcode) {
    case MVM_OP_EMBED: return op_embed(c);
    case MVM_OP_RMS_LINEAR: return op_rms_linear(c);
    case MVM_OP_RMS_LINEAR_ROPE: return op_rms_linear_rope(c);
    case MVM_OP_RMS_LINEAR_KV: return op_rms_linear_kv(c);
    case MVM_OP_RMS_SWIGLU: return op_rms_swiglu(c);
    case MVM_OP_LINEAR_RESIDUAL: return op_linear_residual(c);
    case MVM_OP_ATTN_PARTIAL: return op_attn_partial(c);
    case MVM_OP_ATTN_COMBINE: return op_attn_combine(c);
    case MVM_OP_RMS_LINEAR_ARGMAX: return op_rms_linear_argmax(c);
    case MVM_OP_ARGMAX: return op_argmax(c);
    case MVM_OP_RMSNORM: return op_rmsnorm(c);
    case MVM_OP_LINEAR: return op_linear(c);
    case MVM_OP_ADD: return op_add(c);
    case MVM_OP_ROPE: return op_rope(c);
    case MVM_OP_KV_APPEND: return op_kv_append(c);
    default:
      if (c.tid == 0) mvm_fail(c.a, MVM_ERR_BAD_OPCODE, c.block, c.qpos, c.ins, -1, c.ins->opcode, MVM_OP_COUNT);
      return false;
  }
}

// Opcodes whose inputs[1] is an RMSNorm weight, loaded before the wait (unless the norm is unfused).
__device__ __forceinline__ bool has_gamma(const mvm_instr_t* in) {
  const uint32_t op = in->opcode;
  return (op == MVM_OP_RMS_LINEAR || op == MVM_OP_RMS_LINEAR_ROPE || op == MVM_OP_RMS_LINEAR_KV ||
          op == MVM_OP_RMS_SWIGLU || op == MVM_OP_RMS_LINEAR_ARGMAX) && in->params[PARAM_NORM] != 0;
}

#ifndef MVM_PREFETCH_TABLES
#define MVM_PREFETCH_TABLES 1
#endif
// Before the wait, into L1: the descriptors and device pointers of the instruction's operands and
// its streams' line. An opcode reads them first thing after the wait, and each read that misses is
// an L2 round trip in series with the loads it sizes.
__device__ __forceinline__ void prefetch_tables(const mvm_ctx& c) {
  const int k = c.tid - 32;                      // warp 1: thread 0 is about to wait
  const mvm_instr_t* in = c.ins;
  if (k < 0 || k > in->n_inputs + in->n_outputs) return;
  const char* p;
  if (k == in->n_inputs + in->n_outputs) {
    p = reinterpret_cast<const char*>(in) + 128;
  } else {
    const int b = k < in->n_inputs ? in->inputs[k] : in->outputs[k - in->n_inputs];
    asm volatile("prefetch.global.L1 [%0];" ::"l"(c.a.ptrs + b));
    p = reinterpret_cast<const char*>(c.a.buffers + b);
    asm volatile("prefetch.global.L1 [%0];" ::"l"(p + sizeof(mvm_buffer_t) - 1));
  }
  asm volatile("prefetch.global.L1 [%0];" ::"l"(p));
}

// One step: walk this block's queue. Returns false once the grid is aborting.
__device__ __forceinline__ bool run_queue(mvm_ctx& c, uint32_t q0, uint32_t q1) {
  const mvm_args& a = c.a;
  mvm_smem& s = c.s;
  for (uint32_t qi = q0; qi < q1; ++qi) {
    c.qpos = qi - q0;
    c.ins = a.instrs + a.queue_entries[qi];
    const unsigned long long t0 = a.trace ? globaltimer() : 0;
#if MVM_PREFETCH_TABLES
    prefetch_tables(c);
#endif
    if (has_gamma(c.ins)) prefetch_gamma(c, c.ins->inputs[1], c.ins->inputs[2]);
    else if (c.ins->opcode == MVM_OP_ATTN_PARTIAL && c.synced) attn_prefetch(c);
    // wait for this instruction's activations (its weights are already streaming in)
    if (c.tid == 0) s.abort = !wait_counters(c);
    consumer_sync();
    if (s.abort) return false;
    if (c.ins->n_waits > 0) c.synced = true;
    const unsigned long long t1 = a.trace ? globaltimer() : 0;
    const bool ok = dispatch(c);
    consumer_sync();
    if (!ok) return false;
    if (c.tid == 0) {
      if (a.trace) {
        unsigned long long* t = a.trace + 4 * c.ins->task;
        t[0] = t0;
        t[1] = t1;
        t[2] = globaltimer();
        t[3] = blockIdx.x;
      }
      // NOTE: the consumer_sync above orders every thread's writes before this release (cumulative)
      if (c.ins->signal >= 0) red_release(a.counters + c.ins->signal, 1u);
    }
  }
  return true;
}

extern "C" __global__ void __launch_bounds__(NTHREADS, 1) mvm_megakernel(const __grid_constant__ mvm_args a) {
  extern __shared__ __align__(128) unsigned char smem_raw[];
  mvm_smem& s = *reinterpret_cast<mvm_smem*>(smem_raw);
  if (aborted(a)) return;  // an earlier launch failed; the host resets before running again
  const uint32_t q0 = a.queue_offsets[blockIdx.x], q1 = a.queue_offsets[blockIdx.x + 1];
  const bool direct = (a.flags & MVM_FLAG_DIRECT_LOADS) || !MVM_HAS_RING;
  ring_init(s);
  if (threadIdx.x == 0) s.abort = 0;
  __syncthreads();
  if (threadIdx.x >= NCT) {
    if (!direct) loader(a, s, q0, q1);
    return;
  }
  mvm_ctx c{a, s, (int)threadIdx.x, (int)threadIdx.x / 32, (int)threadIdx.x % 32, blockIdx.x, 0, nullptr,
            0, 0, false, -1, 0u, 0, 0u, direct};
  for (uint32_t step = 0; step < a.n_steps; ++step) {
    c.step = step;
    c.epoch = a.epoch + step;
    c.synced = step == 0;                        // earlier launches are complete
    if (!run_queue(c, q0, q1)) return;
  }
}

// ---- host API, loaded with ctypes ----------------------------------------------------------
extern "C" {

int mvm_abi_version() { return MEGAVM_ABI_VERSION; }
int mvm_threads() { return NTHREADS; }
int mvm_smem_bytes() { return (int)sizeof(mvm_smem); }
int mvm_stage_bytes() { return STAGE_BYTES; }

// Raise the dynamic shared-memory limit; report how many blocks can be co-resident on the device.
int mvm_prepare(int device, int* max_blocks) {
  cudaError_t e = cudaSetDevice(device);
  if (e != cudaSuccess) return (int)e;
  e = cudaFuncSetAttribute(mvm_megakernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sizeof(mvm_smem));
  if (e != cudaSuccess) return (int)e;
  int per_sm = 0, sms = 0;
  e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, mvm_megakernel, NTHREADS, sizeof(mvm_smem));
  if (e != cudaSuccess) return (int)e;
  e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  if (e != cudaSuccess) return (int)e;
  *max_blocks = per_sm * sms;
  return 0;
}

int mvm_launch(const mvm_args* args, int grid, void* stream) {
  void* params[] = {(void*)args};
  cudaError_t e = cudaLaunchCooperativeKernel((const void*)mvm_megakernel, dim3(grid), dim3(NTHREADS), params,
                                              sizeof(mvm_smem), (cudaStream_t)stream);
  return (int)e;
}

const char* mvm_error_string(int code) { return cudaGetErrorString((cudaError_t)code); }

}  // extern "C"
