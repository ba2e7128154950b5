// LORA_A: u[0, row0:row0+n] = A[id, row0:row0+n] (g v) (instructions/lora_a.py). The task's rows of A land in
// shared memory while it waits for v (copies that keep them in L2 for the next step); after the wait, v is
// loaded whole (polled where tagged), each warp takes rows and each lane 16-byte pieces of a row, one warp
// sum a row.
#pragma once
#include "gemv_core.cuh"
#include "load_x.cuh"
#include "lora.cuh"

// 16 bytes from global to shared memory, asynchronously, the line kept in L2 (evict_last).
__device__ __forceinline__ void cp_async16_keep(void* smem, const void* gmem, uint64_t policy) {
  asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2;"
               ::"r"((uint32_t)__cvta_generic_to_shared(smem)), "l"(gmem), "l"(policy) : "memory");
}

// Where v goes in xs: after the task's rows of A (a multiple of 16 bytes: L % 8 == 0).
__device__ __forceinline__ float* lora_a_vs(mvm_ctx& c, const mvm_buffer_t& ai, int n) {
  return c.s.xs + (long)n * ai.shape[2] * elem_bytes(ai.dtype) / 4;
}

// Before the wait: rows row0 .. row0 + n of A[id] (contiguous) copied to the start of xs, and g (the RMSNorm
// weight, where the group has one) where v will go, each element by the thread that multiplies it by v.
// Nothing for id 0; an id out of range is left to the body, which fails the launch.
__device__ __forceinline__ void lora_a_prewait(mvm_ctx& c, int ab, int idb, int gb, int row0, int n) {
  const int id = lora_begin(c, idb);
  const mvm_buffer_t& ai = bufinfo(c, ab);
  if (id <= 0 || id >= ai.shape[0]) return;
  if (gb >= 0) {
    float* vs = lora_a_vs(c, ai, n);
    for (int i = c.tid * 4; i < (int)ai.shape[2]; i += NCT * 4)
      *reinterpret_cast<float4*>(vs + i) = make_float4(weight_at(c, gb, i), weight_at(c, gb, i + 1),
                                                       weight_at(c, gb, i + 2), weight_at(c, gb, i + 3));
  }
  const long bytes = (long)n * ai.shape[2] * elem_bytes(ai.dtype);
  const char* a = (const char*)buf(c, ab) + ((long)id * ai.shape[1] + row0) * ai.shape[2] * elem_bytes(ai.dtype);
  uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(policy));
  char* s = reinterpret_cast<char*>(c.s.xs);
  for (long o = 16L * c.tid; o < bytes; o += 16L * NCT) cp_async16_keep(s + o, a + o, policy);
}

// The task's rows of A (staged in xs, P 16-byte pieces each) against vs: warp w takes rows w, w + NCW, ...,
// lane l their pieces l, l + 32, ... (gemv_core's dot16 with runs 4 apart: a piece's 8 elements of vs in order).
template <typename T>
__device__ __forceinline__ void lora_a_rows(mvm_ctx& c, const float* vs, int n, int P, int row0, float* U, bool ut,
                                            uint32_t tag) {
  constexpr int PER = 16 / sizeof(T);
  for (int j = c.warp; j < n; j += NCW) {
    const uint4* row = reinterpret_cast<const uint4*>(c.s.xs) + (long)j * P;
    float s = 0.f;
    for (int q = c.lane; q < P; q += 32) s += dot16<T>(row[q], vs + q * PER, 4);
    s = warp_sum(s);
    if (c.lane == 0) act_store(U, ut, row0 + j, s, tag);
  }
}

__device__ bool op_lora_a(mvm_ctx& c) {
  const int ab = LORA_A::a(c.ins);
  const int id = lora_begin(c, LORA_A::adapter(c.ins));
  if (!lora_id_ok(c, id, ab)) return false;
  if (id == 0) return true;
  const mvm_buffer_t& ai = bufinfo(c, ab);
  const int L = (int)ai.shape[2], n = LORA_A::nrows(c.ins), row0 = LORA_A::row0(c.ins);
  const int isz = elem_bytes(ai.dtype);
  const bool bf16 = ai.dtype == MVM_BF16;
  float* vs = lora_a_vs(c, ai, n);
  const int vb = LORA_A::v(c.ins);
  const bool normed = LORA_A::gamma(c.ins) >= 0;  // g in vs since the prewait
  const float* v = (const float*)buf(c, vb);
  const bool vt = buf_tagged(c, vb);
  for (int i = c.tid * 4; i < L; i += NCT * 4)   // g v into vs, as a GEMV loads its x (split 0)
    put_x(vs, i, L, 0, normed,
          vt ? act4_tagged(c, vb, reinterpret_cast<const uint64_t*>(v), i)
             : __ldcg(reinterpret_cast<const float4*>(v + i)), 0.f);
  if (vt) tag_acquire();
  cp_async_wait_all();
  consumer_sync();
  const int ub = LORA_A::u(c.ins);
  const bool ut = buf_tagged(c, ub);
  const uint32_t tag = step_tag(c);
  float* U = (float*)buf(c, ub);
  const int P = L * isz / 16;                    // 16-byte pieces of a row
  if (ut) tag_release();
  if (bf16)
    lora_a_rows<__nv_bfloat16>(c, vs, n, P, row0, U, ut, tag);
  else
    lora_a_rows<float>(c, vs, n, P, row0, U, ut, tag);
  return true;
}
