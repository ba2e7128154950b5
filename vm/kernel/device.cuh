// The VM's device side: launch arguments, per-block context, waits and signals on counters, the
// weight ring (loader warp -> consumer warps), and the abort path. Opcodes live in instructions/.
#pragma once
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <stdint.h>
#ifdef MVM_PROBE_LOADER
#include <cstdio>
#endif
#include "../abi.h"

#ifndef MVM_CONSUMER_WARPS
#define MVM_CONSUMER_WARPS 8
#endif
#ifndef MVM_STAGES
#define MVM_STAGES 10
#endif
#ifndef MVM_INFLIGHT
#define MVM_INFLIGHT 2                           // ring stages a loader keeps in flight at once
#endif
#ifndef MVM_STAGE_BYTES
#define MVM_STAGE_BYTES 16384
#endif

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
#define MVM_HAS_RING 0
#else
#define MVM_HAS_RING 1
#endif

constexpr int NCW = MVM_CONSUMER_WARPS;          // consumer warps
constexpr int NCT = NCW * 32;                    // consumer threads
constexpr int NTHREADS = NCT + 32;               // + one loader warp
constexpr int STAGES = MVM_STAGES;
constexpr int STAGE_BYTES = MVM_STAGE_BYTES;
constexpr int ACC_ROWS = MEGAVM_MAX_TILE_ROWS;

enum mvm_flags : uint32_t {
  MVM_FLAG_DIRECT_LOADS = 1u,                    // ablation: consumers load weights themselves, after the wait
  MVM_FLAG_NO_ATTN_HISTORY = 2u,                 // ablation: attention reads every K/V row from L2 after its wait
  MVM_FLAG_WEIGHTS_EVICT_NORMAL = 4u,            // ablation: weight copies without the L2 evict-first hint
};

struct mvm_args {
  const mvm_instr_t* instrs;
  const mvm_buffer_t* buffers;
  const uint32_t* queue_offsets;
  const uint32_t* queue_entries;
  const uint32_t* producers;                     // signals per step, per counter
  void* const* ptrs;                             // device pointer of every buffer
  uint32_t* counters;
  mvm_error_t* error;
  unsigned long long* trace;                     // [n_instrs][4]: start, waited, end (ns), block; or null
  unsigned long long timeout_ns;
  uint32_t epoch;                                // absolute step number of this launch's first step
  uint32_t flags;
  // The in-kernel token loop (vm/loop.py): n_steps decode steps in one launch. Step s decodes
  // seq[s] at position pos + s; its ARGMAX writes seq[s + 1] once s + 1 >= n_prompt. With seq null
  // (n_steps == 1) step 0 decodes token.
  int* seq;
  uint32_t n_steps;
  uint32_t n_prompt;
  int32_t step_counter;                          // signalled by the step's last task; roots of step s wait for it
  // The runtime inputs travel by value (checked on the host), so no opcode waits on a load for them.
  int32_t token;
  int32_t pos;
  uint32_t pad0;
};

// Shared memory: ring | xs (f32 activation vector) | acc | barriers
struct mvm_smem {
  alignas(128) unsigned char ring[STAGES][STAGE_BYTES];
  alignas(16) float xs[MEGAVM_MAX_K];
  alignas(16) float acc[2 * ACC_ROWS];
  float red[NCW * 2];
  unsigned long long full[STAGES];
  unsigned long long empty[STAGES];
  unsigned long long attn_bar;                   // attention's K/V history copies (instructions/attention.cuh)
  int abort;
};

struct mvm_ctx {
  const mvm_args& a;
  mvm_smem& s;
  int tid;                                       // consumer thread index, 0..NCT-1
  int warp, lane;
  uint32_t block, qpos;                          // for dumps
  const mvm_instr_t* ins;
  uint32_t step, epoch;                          // step within the launch; absolute step (counter thresholds)
  bool synced;                                   // this step's writes of earlier steps are visible (a wait passed)
  int attn_hist;                                 // K/V rows copied into shared memory for the next partial, or -1
  uint32_t attn_phase;
  int stage;                                     // ring position, advanced in lockstep with the loader
  uint32_t phase;
  bool direct;
};

// ---- memory-model primitives ---------------------------------------------------------------
__device__ __forceinline__ uint32_t ld_acquire(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void red_release(uint32_t* p, uint32_t v) {
  asm volatile("red.release.gpu.global.add.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ unsigned long long globaltimer() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
__device__ __forceinline__ void consumer_sync() { asm volatile("bar.sync 1, %0;" ::"n"(NCT) : "memory"); }

__device__ __forceinline__ uint32_t smem_addr(const void* p) { return (uint32_t)__cvta_generic_to_shared(p); }

// ---- abort path ----------------------------------------------------------------------------
__device__ __forceinline__ bool aborted(const mvm_args& a) {
  return *(volatile uint32_t*)&a.error->status != MVM_OK;
}

__device__ void mvm_fail(const mvm_args& a, uint32_t status, uint32_t block, uint32_t qpos,
                         const mvm_instr_t* ins, int counter, uint32_t value, uint32_t target) {
  if (atomicCAS(&a.error->status, 0u, 0xFFFFFFFFu) == 0u) {
    a.error->block = block;
    a.error->instr = qpos;
    a.error->task = ins ? ins->task : 0xFFFFFFFFu;
    a.error->opcode = ins ? ins->opcode : 0xFFFFFFFFu;
    a.error->counter = counter;
    a.error->value = value;
    a.error->target = target;
    __threadfence();
    atomicExch(&a.error->status, status);
  }
}

// ---- counters ------------------------------------------------------------------------------
// Spin (acquire) until counter ctr reaches target; false on abort or timeout (with a dump).
__device__ bool wait_one(mvm_ctx& c, int ctr, uint32_t target) {
  const uint32_t* p = c.a.counters + ctr;
  uint32_t v = ld_acquire(p);
  if ((int32_t)(v - target) >= 0) return true;
  const unsigned long long t0 = globaltimer();
  for (uint32_t spin = 1;; ++spin) {
    __nanosleep(64);
    v = ld_acquire(p);
    if ((int32_t)(v - target) >= 0) return true;
    if ((spin & 31) == 0) {
      if (aborted(c.a)) return false;
      if (globaltimer() - t0 > c.a.timeout_ns) {
        mvm_fail(c.a, MVM_ERR_WAIT_TIMEOUT, c.block, c.qpos, c.ins, ctr, v, target);
        return false;
      }
    }
  }
}

// Thread 0 of the consumers waits for every counter of the instruction. A root (no waits) of a
// step after the launch's first also waits for the previous step's end. Returns false on abort.
__device__ bool wait_counters(mvm_ctx& c) {
  const mvm_instr_t* in = c.ins;
  if (in->n_waits == 0 && c.step > 0 && c.a.step_counter >= 0) {
    const int ctr = c.a.step_counter;
    if (!wait_one(c, ctr, c.epoch * c.a.producers[ctr])) return false;
  }
  for (int i = 0; i < in->n_waits; ++i) {
    const int ctr = in->waits[i].counter;
    if (!wait_one(c, ctr, in->waits[i].threshold + c.epoch * c.a.producers[ctr])) return false;
  }
  return true;
}

// Runtime inputs as the opcodes read them: under the token loop, step s decodes seq[s] at pos + s.
__device__ __forceinline__ int input_token(const mvm_ctx& c) { return c.a.seq ? __ldcg(c.a.seq + c.step) : c.a.token; }
__device__ __forceinline__ int input_pos(const mvm_ctx& c) { return c.a.pos + (int)c.step; }

// ---- weight ring ---------------------------------------------------------------------------
__device__ __forceinline__ bool mbar_try_wait(uint32_t bar, uint32_t parity) {
#if MVM_HAS_RING
  uint32_t ok;
  asm volatile(
      "{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
      : "=r"(ok) : "r"(bar), "r"(parity) : "memory");
  return ok;
#else
  return true;
#endif
}

// A walk over the weight bytes of this block's queue (every stream of every instruction, the queue
// once per step), in pieces of at most max_bytes. The current stream's address and length stay in
// registers, so a piece inside a stream costs no table reads.
struct weight_walk {
  uint32_t step, qi;
  int si;                                        // the stream after the current one
  const unsigned char* src;                      // the current stream's next byte
  uint64_t left;                                 // its bytes not yet walked
  __device__ bool next(const mvm_args& a, uint32_t q0, uint32_t q1, uint32_t max_bytes, const unsigned char*& p,
                       uint32_t& n) {
    while (left == 0) {                          // open the next stream
      if (step >= a.n_steps) return false;
      const mvm_instr_t* in = a.instrs + a.queue_entries[qi];
      if (si < in->n_streams) {
        const mvm_stream_t& st = in->streams[si++];
        src = (const unsigned char*)a.ptrs[st.buffer] + st.byte_offset;
        left = st.byte_count;
      } else {
        si = 0;
        if (++qi == q1) { qi = q0; ++step; }
      }
    }
    n = (uint32_t)(left < max_bytes ? left : max_bytes);
    p = src;
    src += n;
    left -= n;
    return true;
  }
};

// A timing probe (-DMVM_PROBE_LOADER=1): how long a loader waited for copies to land and for a free
// ring stage; each eighth block prints its totals for the launch of epoch 5. Empty otherwise.
struct loader_probe {
#ifdef MVM_PROBE_LOADER
  unsigned long long start = globaltimer(), full = 0, landing = 0, mark = 0, copies = 0;
  __device__ void begin() { mark = globaltimer(); }
  __device__ void landed() { landing += globaltimer() - mark; }
  __device__ void ring_freed() { full += globaltimer() - mark; ++copies; }
  __device__ void report(const mvm_args& a) const {
    if (a.epoch == 5 && blockIdx.x % 8 == 0)
      printf("LOADER blk %u span_ns %llu ring_full_ns %llu landing_ns %llu copies %llu\n", blockIdx.x,
             globaltimer() - start, full, landing, copies);
  }
#else
  __device__ void begin() {}
  __device__ void landed() {}
  __device__ void ring_freed() {}
  __device__ void report(const mvm_args&) const {}
#endif
};

// The loader warp: stream every weight range of every instruction of this block's queue into the
// ring, in queue order (the queue once per step), never looking at counters. At most MVM_INFLIGHT
// copies are in flight at once: more only lengthens the memory queues that other SMs' latency-bound
// loads (activations, attention's K/V) wait behind (docs/performance.md).
// Weights are read once a step, so their copies carry an L2 evict-first hint: the activations, KV
// cache and counters that the latency-bound steps read stay in L2.
__device__ void loader(const mvm_args& a, mvm_smem& s, uint32_t q0, uint32_t q1) {
#if MVM_HAS_RING
  if ((threadIdx.x & 31) != 0 || q0 == q1) return;
  int stage = 0;
  uint32_t phase = 0;
  uint64_t issued = 0;                           // copies issued so far
  weight_walk copy{0, q0, 0, nullptr, 0};
  const unsigned char* src;
  uint32_t n;
  uint64_t policy;
  if (a.flags & MVM_FLAG_WEIGHTS_EVICT_NORMAL)
    asm volatile("createpolicy.fractional.L2::evict_normal.b64 %0, 1.0;" : "=l"(policy));
  else
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
  loader_probe probe;
  while (copy.next(a, q0, q1, STAGE_BYTES, src, n)) {
    if (MVM_INFLIGHT < STAGES && issued >= MVM_INFLIGHT) {
      // wait until the copy issued MVM_INFLIGHT copies ago has landed
      const uint64_t old = issued - MVM_INFLIGHT;
      const uint32_t landed = smem_addr(&s.full[old % STAGES]);
      probe.begin();
      for (uint32_t spin = 0; !mbar_try_wait(landed, (uint32_t)(old / STAGES) & 1u); ++spin) {
        if ((spin & 1023) == 1023 && aborted(a)) return;
      }
      probe.landed();
    }
    const uint32_t empty = smem_addr(&s.empty[stage]);
    probe.begin();
    for (uint32_t spin = 0; !mbar_try_wait(empty, phase ^ 1u); ++spin) {
      if ((spin & 1023) == 1023 && aborted(a)) return;
    }
    probe.ring_freed();
    ++issued;
    const uint32_t full = smem_addr(&s.full[stage]);
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(full), "r"(n) : "memory");
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, [%3], %4;"
        ::"r"(smem_addr(s.ring[stage])), "l"(src), "r"(n), "r"(full), "l"(policy) : "memory");
    if (++stage == STAGES) { stage = 0; phase ^= 1u; }
  }
  probe.report(a);
#endif
}

__device__ __forceinline__ void ring_init(mvm_smem& s) {
#if MVM_HAS_RING
  if (threadIdx.x == 0) {
    for (int i = 0; i < STAGES; ++i) {
      asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem_addr(&s.full[i])) : "memory");
      asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(&s.empty[i])), "n"(NCW) : "memory");
    }
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem_addr(&s.attn_bar)) : "memory");
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
#endif
}

// A timing probe (-DMVM_PROBE_CHAIN=1): the phases of the opcodes on the attention chain. PROBE_BEGIN
// and each PROBE_PHASE mark a time (after a consumer_sync, so a phase ends when its slowest warp
// does); PROBE_REPORT prints one line of phase durations (ns) per sampled task of the launch of epoch
// 5. bench/probe_chain.py averages them. Empty otherwise.
#ifdef MVM_PROBE_CHAIN
#include <cstdio>
struct chain_probe {
  unsigned long long t[8];
  int n = 0;
  __device__ void mark(const mvm_ctx& c) {
    consumer_sync();
    if (c.tid == 0 && n < 8) t[n++] = globaltimer();
  }
  __device__ void report(const mvm_ctx& c, const char* phases, int key, int every) const {
    if (c.tid != 0 || c.epoch != 5 || c.ins->task % every) return;
    unsigned long long d[7] = {0, 0, 0, 0, 0, 0, 0};
    for (int i = 1; i < n; ++i) d[i - 1] = t[i] - t[i - 1];
    printf("CHAIN %s/%d task %u: %llu %llu %llu %llu %llu %llu %llu\n", phases, key, c.ins->task, d[0], d[1], d[2],
           d[3], d[4], d[5], d[6]);
  }
};
#define PROBE_BEGIN chain_probe probe_; probe_.mark(c)
#define PROBE_PHASE probe_.mark(c)
#define PROBE_REPORT(phases, key, every) probe_.report(c, phases, key, every)
#else
#define PROBE_BEGIN
#define PROBE_PHASE
#define PROBE_REPORT(phases, key, every)
#endif

// ---- small helpers -------------------------------------------------------------------------
template <typename T> __device__ __forceinline__ float to_f(T v);
template <> __device__ __forceinline__ float to_f<float>(float v) { return v; }
template <> __device__ __forceinline__ float to_f<__nv_bfloat16>(__nv_bfloat16 v) { return __bfloat162float(v); }
template <typename T> __device__ __forceinline__ T from_f(float v);
template <> __device__ __forceinline__ float from_f<float>(float v) { return v; }
template <> __device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float v) { return __float2bfloat16(v); }

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Sum over all consumer threads, same order every run. Ends with a consumer_sync.
__device__ __forceinline__ float consumer_sum(mvm_ctx& c, float v) {
  v = warp_sum(v);
  if (c.lane == 0) c.s.red[c.warp] = v;
  consumer_sync();
  float t = 0.f;
  for (int w = 0; w < NCW; ++w) t += c.s.red[w];
  consumer_sync();
  return t;
}

__device__ __forceinline__ void* buf(const mvm_ctx& c, int slot_buffer) { return c.a.ptrs[slot_buffer]; }
__device__ __forceinline__ const mvm_buffer_t& bufinfo(const mvm_ctx& c, int b) { return c.a.buffers[b]; }
__device__ __forceinline__ int pint(const mvm_ctx& c, int i) { return (int)c.ins->params[i]; }
__device__ __forceinline__ float pfloat(const mvm_ctx& c, int i) { return __uint_as_float(c.ins->params[i]); }
