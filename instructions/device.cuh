// What an opcode body is written against: the block's shared memory and the per-block context
// (mvm_ctx), buffer access, the consumer warps' barrier and reductions, the abort path, the runtime
// inputs, and the mbarrier / bulk-copy primitives of the weight ring. The VM's own device code (the
// loader, counter waits, the queue walk) is in vm/kernel/ and builds on this.
#pragma once
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <stdint.h>
#include "../core/abi.h"
#include "../core/limits.h"
#include "opcodes.cuh"

// The weight ring's bulk copies and mbarrier waits need sm_90; older targets build with consumers
// loading their weights themselves (the direct-loads path), so the CUDA sources compile for them too.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
#define MVM_HAS_RING 0
#else
#define MVM_HAS_RING 1
#endif

constexpr int NCW = MVM_CONSUMER_WARPS;          // consumer warps
constexpr int NCT = NCW * 32;                    // consumer threads
// + one loader warp; with MVM_REG_SPLIT a warpgroup: the loader and three warps that exit at once, so that
// setmaxnreg can move the group's registers to the consumers (megakernel.cu)
constexpr int NTHREADS = NCT + (MVM_REG_SPLIT ? 128 : 32);
// setmaxnreg's counts (megakernel.cu: 56 for the loader's warpgroup, 224 for the consumers) fit the SM's 65536
// registers at 8 consumer warps only; with more, the consumers' setmaxnreg.inc would wait for registers forever.
static_assert(!MVM_REG_SPLIT || (NCW == 8 && NCT * 224 + 128 * 56 <= 65536),
              "MVM_REG_SPLIT is set for 8 consumer warps (384 x 168 = 256 x 224 + 128 x 56); build it with 0");
constexpr int STAGES = MVM_STAGES;
constexpr int STAGE_BYTES = MVM_STAGE_BYTES;
constexpr int ACC_ROWS = MEGAVM_MAX_TILE_ROWS;
constexpr bool HAS_RING = MVM_HAS_RING;

// The KV cache's rows (instructions/kv_cache.py: swizzled): a bf16 or e4m3 cache whose head_dim is a
// multiple of 64 keeps the 16-byte chunk c of cache row t at c ^ kv_xor(t): t % 8, or for e4m3 rows of 64
// (two rows a 128-byte line) (t / 2) % 4. kv_swizzle is the mask that applies (7, 3, or 0: none).
template <typename T> __device__ __forceinline__ int kv_swizzle(int hd) {
  return sizeof(T) == 2 && hd % 64 == 0 ? 7 : sizeof(T) == 1 && hd % 64 == 0 ? (hd == 64 ? 3 : 7) : 0;
}
__device__ __forceinline__ int kv_xor(int t, int sw) { return sw == 3 ? (t >> 1) & 3 : t & sw; }

// Shared memory: ring | xs (f32 activation vector and scratch) | acc | barriers
struct mvm_smem {
  alignas(128) unsigned char ring[STAGES][STAGE_BYTES];
  alignas(16) float xs[MEGAVM_MAX_K];
  alignas(16) float acc[2 * ACC_ROWS];
  float red[NCW * 2];
  unsigned long long full[STAGES];
  unsigned long long empty[STAGES];
  int abort;
  int inline_next;                               // the inline instruction this block runs next, or -1
};

struct mvm_ctx {
  const mvm_args_t& a;
  mvm_smem& s;
  int tid;                                       // consumer thread index, 0..NCT-1
  int warp, lane;
  uint32_t block, qpos;                          // for dumps
  const mvm_instr_t* ins;
  uint32_t step, epoch;                          // step within the launch; absolute step (counter thresholds)
  int stage;                                     // ring position, advanced in lockstep with the loader
  uint32_t phase;
  bool direct;
};

__device__ __forceinline__ void consumer_sync() { asm volatile("bar.sync 1, %0;" ::"n"(NCT) : "memory"); }
__device__ __forceinline__ uint32_t smem_addr(const void* p) { return (uint32_t)__cvta_generic_to_shared(p); }
// 16 bytes of shared memory at a shared-window address (an explicit LDS: through a generic pointer in
// an out-of-line function the compiler emits generic loads).
__device__ __forceinline__ uint4 lds128(uint32_t addr) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(addr));
  return v;
}
// 16 bytes at byte offset off (below twice the ring's size) from the weight ring's start ring0, wrapped at its
// end: a row that straddles the last stage goes on in the first.
__device__ __forceinline__ uint4 lds128_ring(uint32_t ring0, uint32_t off) {
  constexpr uint32_t RING = (uint32_t)STAGES * STAGE_BYTES;
  return lds128(ring0 + (off >= RING ? off - RING : off));
}
__device__ __forceinline__ float ldsf32(uint32_t addr) {
  float v;
  asm volatile("ld.shared.f32 %0, [%1];" : "=f"(v) : "r"(addr));
  return v;
}
__device__ __forceinline__ uint32_t lds32(uint32_t addr) {
  uint32_t v;
  asm volatile("ld.shared.u32 %0, [%1];" : "=r"(v) : "r"(addr));
  return v;
}
__device__ __forceinline__ void sts32(uint32_t addr, uint32_t v) {
  asm volatile("st.shared.u32 [%0], %1;" ::"r"(addr), "r"(v) : "memory");
}
__device__ __forceinline__ float4 ldsf4(uint32_t addr) {
  float4 v;
  asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];" : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "r"(addr));
  return v;
}

__device__ __forceinline__ unsigned long long globaltimer() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// ---- abort path ----------------------------------------------------------------------------
__device__ __forceinline__ bool aborted(const mvm_args_t& a) {
  return *(volatile uint32_t*)&a.error->status != MVM_OK;
}

__device__ void mvm_fail(const mvm_args_t& a, uint32_t status, uint32_t block, uint32_t qpos,
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

// A runtime input outside [0, limit): the launch fails with a dump naming the value and the limit.
__device__ __forceinline__ bool input_in_range(mvm_ctx& c, int v, long limit) {
  if (v >= 0 && v < limit) return true;
  if (c.tid == 0) mvm_fail(c.a, MVM_ERR_BAD_INPUT, c.block, c.qpos, c.ins, -1, (uint32_t)v, (uint32_t)limit);
  return false;
}

// Runtime inputs as the opcodes read them: under the token loop, step s decodes seq[s] at pos + s.
__device__ __forceinline__ int input_token(const mvm_ctx& c) { return c.a.seq ? __ldcg(c.a.seq + c.step) : c.a.token; }
__device__ __forceinline__ int input_pos(const mvm_ctx& c) { return c.a.pos + (int)c.step; }

// ---- mbarriers and bulk copies (sm_90) -----------------------------------------------------
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

__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
#if MVM_HAS_RING
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
#endif
}

// Arm bar for `bytes` more bytes of bulk copies, and arrive.
__device__ __forceinline__ void mbar_expect_bytes(uint32_t bar, uint32_t bytes) {
#if MVM_HAS_RING
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
#endif
}

// A bulk copy of `bytes` (a multiple of 16, both ends 16-byte aligned) from global into shared
// memory, completing on bar.
__device__ __forceinline__ void bulk_copy(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar) {
#if MVM_HAS_RING
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
               ::"r"(dst), "l"(src), "r"(bytes), "r"(bar) : "memory");
#endif
}

// Order this thread's earlier generic accesses (its block's shared memory, other SMs' writes it has
// seen) before its later bulk copies.
__device__ __forceinline__ void fence_proxy_async() {
#if MVM_HAS_RING
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
  asm volatile("fence.proxy.async.global;" ::: "memory");
#endif
}

// Bring [p, p + n) into L2 (one bulk prefetch, rounded out to 16-byte bounds); no-op off Hopper.
__device__ __forceinline__ void prefetch_l2(const void* p, uint64_t n) {
#if MVM_HAS_RING
  const uint64_t a = (uint64_t)p & ~15ull, e = ((uint64_t)p + n + 15) & ~15ull;
  if (e > a) asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(a), "r"((uint32_t)(e - a)) : "memory");
#endif
}
// 16 (8) bytes from global memory to shared memory, asynchronously (cp_async_wait_all: this thread's landed;
// or commit groups of them and wait for all but the newest few).
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"((uint32_t)__cvta_generic_to_shared(smem)), "l"(gmem)
               : "memory");
}
__device__ __forceinline__ void cp_async8(void* smem, const void* gmem) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8;" ::"r"((uint32_t)__cvta_generic_to_shared(smem)), "l"(gmem)
               : "memory");
}
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_all;" ::: "memory"); }

// ---- small helpers -------------------------------------------------------------------------
// Bytes per element of a buffer's dtype (E2M1, U4: 0, two codes share a byte; their rows are K / 2 bytes).
__device__ __forceinline__ int elem_bytes(int dtype) {
  return dtype == MVM_BF16 || dtype == MVM_F16 ? 2 : dtype == MVM_F8E4M3 ? 1 : dtype == MVM_E2M1 || dtype == MVM_U4 ? 0 : 4;
}
// The bytes of n elements of a dtype (E2M1, U4: two a byte; n even).
__device__ __forceinline__ uint64_t elems_bytes(int dtype, uint64_t n) {
  return dtype == MVM_E2M1 || dtype == MVM_U4 ? n / 2 : n * elem_bytes(dtype);
}

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

// A buffer's device pointer and descriptor, by buffer id (an opcode's accessors give the ids).
__device__ __forceinline__ void* buf(const mvm_ctx& c, int b) { return c.a.ptrs[b]; }
__device__ __forceinline__ const mvm_buffer_t& bufinfo(const mvm_ctx& c, int b) { return c.a.buffers[b]; }

// Element i of a small f32 or bf16 weight vector (a bias, a norm's weight).
__device__ __forceinline__ float weight_at(const mvm_ctx& c, int b, int i) {
  return bufinfo(c, b).dtype == MVM_BF16 ? to_f(((const __nv_bfloat16*)buf(c, b))[i]) : ((const float*)buf(c, b))[i];
}
