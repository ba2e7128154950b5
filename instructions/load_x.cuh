// The activation vector into shared memory (xs, in gemv_core.cuh's layout): the RMSNorm weight before
// the wait, then x, plain or tagged, normalised where asked. Every projection's prologue, RMSNORM's and
// LORA_A's, so that they compute bit-identical inputs.
#pragma once
#include "gemv_core.cuh"

// Before the wait (weights never wait): xs[0:K] = gamma, the RMSNorm weight of the next instruction.
// One 16-byte read-only load per thread per round (K = 2048 in bf16: one round). Element by element
// through a generic pointer, the compiler kept each load behind the shared-memory store before it (they
// might alias): one memory round trip per element, 7% of llama-1b's warp samples (ncu, 979361b).
template <typename G>
__device__ void prefetch_gamma_t(mvm_ctx& c, const G* gamma, int K, int split) {
  constexpr int V = 16 / sizeof(G);              // elements per load
  const int vec = K % 16 == 0 && (reinterpret_cast<uintptr_t>(gamma) & 15) == 0 ? K : 0;
  for (int i = c.tid * V; i < vec; i += NCT * V) {
    const uint4 raw = __ldg(reinterpret_cast<const uint4*>(gamma + i));
    const G* g = reinterpret_cast<const G*>(&raw);
#pragma unroll
    for (int e = 0; e < V; e += 4)
      *reinterpret_cast<float4*>(c.s.xs + xs_index(i + e, K, split)) =
          make_float4(to_f(g[e]), to_f(g[e + 1]), to_f(g[e + 2]), to_f(g[e + 3]));
  }
  for (int i = vec + c.tid; i < K; i += NCT) c.s.xs[xs_index(i, K, split)] = to_f(__ldg(gamma + i));
}
__device__ __forceinline__ void prefetch_gamma(mvm_ctx& c, int gamma_buf, int w_buf) {
  const int K = (int)bufinfo(c, gamma_buf).shape[0];
  if (bufinfo(c, gamma_buf).dtype == MVM_BF16)
    prefetch_gamma_t(c, (const __nv_bfloat16*)buf(c, gamma_buf), K, xs_split(c, w_buf));
  else
    prefetch_gamma_t(c, (const float*)buf(c, gamma_buf), K, xs_split(c, w_buf));
}

// xs[xs_index(i)] = v, or times what it holds (gamma) when normed; returns ss plus v's squares. The
// one arithmetic of the tagged and plain loads below, and of LORA_A's (instructions/lora_a.cuh).
__device__ __forceinline__ float put_x(float* xs, int i, int K, int split, bool normed, const float4 v, float ss) {
  float4* d = reinterpret_cast<float4*>(xs + xs_index(i, K, split));
  if (normed) {
    const float4 g = *d;
    *d = make_float4(g.x * v.x, g.y * v.y, g.z * v.z, g.w * v.w);
  } else {
    *d = v;
  }
  // explicit fmas: left to the compiler, each inlined copy could contract differently, and the
  // fused and unfused (RMSNORM) forms or the tagged and plain loads would differ in the last bit
  return fmaf(v.w, v.w, fmaf(v.z, v.z, fmaf(v.y, v.y, fmaf(v.x, v.x, ss))));
}

// After the wait: xs = x (f32), or gamma * x / rms(x) when normed (gamma already in xs), in the
// layout above. Ends with a consumer_sync. TAGGED: x is tagged buffer b (instructions/tagged.cuh),
// each word polled until its writer's store has landed.
template <bool TAGGED>
__device__ float load_x_t(mvm_ctx& c, const float* x, int b, bool normed, int K, float eps, int split) {
  float ss = 0.f;
  for (int i = c.tid * 4; i < K; i += NCT * 4)
    ss = put_x(c.s.xs, i, K, split, normed,
               TAGGED ? act4_tagged(c, b, reinterpret_cast<const uint64_t*>(x), i)
                      : __ldcg(reinterpret_cast<const float4*>(x + i)), ss);
  if (TAGGED) tag_acquire();
  if (!normed) {
    consumer_sync();
    return 1.f;
  }
  const float rstd = rsqrtf(consumer_sum(c, ss) / (float)K + eps);
  for (int i = c.tid; i < K; i += NCT) c.s.xs[i] *= rstd;
  consumer_sync();
  return rstd;
}
__device__ __forceinline__ float load_x(mvm_ctx& c, const float* x, bool normed, int K, float eps, int split) {
  return load_x_t<false>(c, x, -1, normed, K, eps, split);
}
