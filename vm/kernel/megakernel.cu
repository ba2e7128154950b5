// The megakernel: one persistent cooperative block per SM. Each block's loader warp streams the
// weights of its queue into the shared-memory ring; its consumer warps walk the same queue:
// prefetch what needs no wait, wait on the instruction's counters, run the opcode, fence and signal.
#include "counters.cuh"
#include "dispatch.cuh"
#include "loader.cuh"

static_assert(sizeof(mvm_smem) <= 227 * 1024, "shared memory over the sm_90 limit");

// Before the wait, into L1: the descriptors and device pointers of the instruction's operands and
// the line of its streams. An opcode reads them first thing after the wait, and each read that misses
// is an L2 round trip in series with the loads it sizes.
__device__ __forceinline__ void prefetch_tables(const mvm_ctx& c) {
  const int k = c.tid - 32;                      // warp 1: thread 0 is about to wait
  const mvm_instr_t* in = c.ins;
  if (k < 0 || k > in->n_inputs + in->n_outputs) return;
  const char* p;
  if (k == in->n_inputs + in->n_outputs) {
    p = reinterpret_cast<const char*>(in->streams);
  } else {
    const int b = k < in->n_inputs ? in->inputs[k] : in->outputs[k - in->n_inputs];
    if (b < 0) return;                           // an optional operand left empty
    asm volatile("prefetch.global.L1 [%0];" ::"l"(c.a.ptrs + b));
    p = reinterpret_cast<const char*>(c.a.buffers + b);
    asm volatile("prefetch.global.L1 [%0];" ::"l"(p + sizeof(mvm_buffer_t) - 1));
  }
  asm volatile("prefetch.global.L1 [%0];" ::"l"(p));
}

// Thread 0 records the trace and signals the instruction's counter. A counter with an inline waiter
// (MEGAVM_INSTR_SIGNALS_INLINE) takes an acquire-release increment, and the signal that completes the
// waiter's wait sets s.inline_next to it (else -1). True when such a counter was signalled: the block
// syncs, then runs s.inline_next if it is set.
__device__ __forceinline__ bool finish(mvm_ctx& c, unsigned long long t0, unsigned long long t1) {
  const mvm_args_t& a = c.a;
  const int sig = c.ins->signal;
  const bool inline_waiter = MVM_INLINE_TASKS && sig >= 0 && (c.ins->flags & MEGAVM_INSTR_SIGNALS_INLINE);
  if (c.tid == 0) {
    if (a.trace) {
      unsigned long long* t = a.trace + 4 * c.ins->task;
      t[0] = t0;
      t[1] = t1;
      t[2] = globaltimer();
      t[3] = blockIdx.x;
    }
    // NOTE: the consumer_sync before this orders every thread's writes before the release (cumulative)
    if (inline_waiter) {
      const int k = a.inline_of[sig];
      const uint32_t target = a.instrs[k].waits[0].threshold + c.epoch * a.producers[sig];
      c.s.inline_next = atom_acq_rel_add(a.counters + sig, 1u) + 1u == target ? k : -1;
    } else if (sig >= 0) {
      // a relaxed signal (vm/pack.py: relaxed_signals) holds the block's next instruction back for nothing
      if (MVM_RELAXED_SIGNALS && (c.ins->flags & MEGAVM_INSTR_SIGNAL_RELAXED))
        red_relaxed(a.counters + sig, 1u);
      else
        red_release(a.counters + sig, 1u);
    }
  }
  return inline_waiter;
}

// Prefetch, wait (a queued instruction; an inline one's wait was met by the signal that chose it), run
// and signal c.ins: -1 on abort, 1 when its signal chose an inline instruction (s.inline_next) to run
// next, else 0.
__device__ __forceinline__ int run_instruction(mvm_ctx& c, bool queued) {
  const mvm_args_t& a = c.a;
  mvm_smem& s = c.s;
  const unsigned long long t0 = a.trace ? globaltimer() : 0;
  if (MVM_PREFETCH_TABLES) prefetch_tables(c);
  prewait(c);                                    // weights and what no counter guards
  // wait for this instruction's activations (its weights are already streaming in)
  if (queued && c.tid == 0) s.abort = !wait_counters(c);
  consumer_sync();
  if (s.abort) return -1;
  const unsigned long long t1 = a.trace ? globaltimer() : 0;
  const bool ok = dispatch(c);
  consumer_sync();
  if (!ok) return -1;
  if (!finish(c, t0, t1)) return 0;
  consumer_sync();                               // s.inline_next, and the acquire, for every thread
  return s.inline_next >= 0 ? 1 : 0;
}

// One step: walk this block's queue. With MVM_INLINE_TASKS, each inline instruction a signal chooses
// (docs/ir.md) runs next, in the same loop (one dispatch site: two made the kernel spill). Returns
// false once the grid is aborting.
__device__ __forceinline__ bool run_queue(mvm_ctx& c, uint32_t q0, uint32_t q1) {
  const mvm_args_t& a = c.a;
#if MVM_INLINE_TASKS
  if (q0 < q1) c.ins = a.instrs + a.queue_entries[q0];
  for (uint32_t qi = q0; qi < q1;) {
    c.qpos = qi - q0;
    const int r = run_instruction(c, !(c.ins->flags & MEGAVM_INSTR_INLINE));
    if (r < 0) return false;
    if (r > 0) {
      c.ins = a.instrs + c.s.inline_next;
      continue;
    }
    if (++qi < q1) c.ins = a.instrs + a.queue_entries[qi];
  }
#else
  for (uint32_t qi = q0; qi < q1; ++qi) {
    c.qpos = qi - q0;
    c.ins = a.instrs + a.queue_entries[qi];
    if (run_instruction(c, true) < 0) return false;
  }
#endif
  return true;
}

extern "C" __global__ void __launch_bounds__(NTHREADS, 1) mvm_megakernel(const __grid_constant__ mvm_args_t a) {
  extern __shared__ __align__(128) unsigned char smem_raw[];
  mvm_smem& s = *reinterpret_cast<mvm_smem*>(smem_raw);
  if (aborted(a)) return;  // an earlier launch failed; the host resets before running again
  const uint32_t q0 = a.queue_offsets[blockIdx.x], q1 = a.queue_offsets[blockIdx.x + 1];
  const bool direct = (a.flags & MVM_FLAG_DIRECT_LOADS) || !HAS_RING;
  ring_init(s);
  if (threadIdx.x == 0) s.abort = 0;
  __syncthreads();
  if (threadIdx.x >= NCT) {
#if MVM_REG_SPLIT && defined(__CUDA_ARCH_FEAT_SM90_ALL)
    asm volatile("setmaxnreg.dec.sync.aligned.u32 56;\n" ::: "memory");   // 384 x 168 = 256 x 224 + 128 x 56
#endif
    if (threadIdx.x < NCT + 32 && !direct) loader(a, s, q0, q1);
    return;
  }
#if MVM_REG_SPLIT && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("setmaxnreg.inc.sync.aligned.u32 224;\n" ::: "memory");
#endif
  mvm_ctx c{a, s, (int)threadIdx.x, (int)threadIdx.x / 32, (int)threadIdx.x % 32, blockIdx.x, 0, nullptr,
            0, 0, 0, 0u, direct};
  for (uint32_t step = 0; step < a.n_steps; ++step) {
    c.step = step;
    c.epoch = a.epoch + step;
    if (!run_queue(c, q0, q1)) return;
  }
}

// ---- host API, loaded with ctypes ----------------------------------------------------------
extern "C" {

int mvm_abi_version() { return MEGAVM_ABI_VERSION; }

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

int mvm_launch(const mvm_args_t* args, int grid, void* stream) {
  void* params[] = {(void*)args};
  cudaError_t e = cudaLaunchCooperativeKernel((const void*)mvm_megakernel, dim3(grid), dim3(NTHREADS), params,
                                              sizeof(mvm_smem), (cudaStream_t)stream);
  return (int)e;
}

const char* mvm_error_string(int code) { return cudaGetErrorString((cudaError_t)code); }

}  // extern "C"
