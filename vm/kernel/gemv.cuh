// The streamed matrix-vector core every projection opcode shares: the activation vector (RMSNorm
// applied when asked) in shared memory, weight rows arriving through the ring in 16-byte pieces,
// per-row sums reduced in a fixed order (bitwise-reproducible).
#pragma once
#include "device.cuh"

// xs[0:K] = x (f32), or gamma * x / rms(x) when gamma is given. Ends with a consumer_sync.
template <typename G>
__device__ void load_x(mvm_ctx& c, const float* x, const G* gamma, int K, float eps) {
  float ss = 0.f;
  for (int i = c.tid * 4; i < K; i += NCT * 4) {
    const float4 v = __ldcg(reinterpret_cast<const float4*>(x + i));
    *reinterpret_cast<float4*>(c.s.xs + i) = v;
    ss += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
  }
  if (gamma == nullptr) {
    consumer_sync();
    return;
  }
  const float rstd = rsqrtf(consumer_sum(c, ss) / (float)K + eps);
  for (int i = c.tid; i < K; i += NCT) c.s.xs[i] = to_f(gamma[i]) * (c.s.xs[i] * rstd);
  consumer_sync();
}

template <typename T>
__device__ __forceinline__ float dot16(const uint4& w, const float* x);
template <>
__device__ __forceinline__ float dot16<__nv_bfloat16>(const uint4& w, const float* x) {
  const float4 x0 = *reinterpret_cast<const float4*>(x), x1 = *reinterpret_cast<const float4*>(x + 4);
  const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&w);
  const float2 a = __bfloat1622float2(h[0]), b = __bfloat1622float2(h[1]);
  const float2 d = __bfloat1622float2(h[2]), e = __bfloat1622float2(h[3]);
  float s = a.x * x0.x;
  s = fmaf(a.y, x0.y, s); s = fmaf(b.x, x0.z, s); s = fmaf(b.y, x0.w, s);
  s = fmaf(d.x, x1.x, s); s = fmaf(d.y, x1.y, s); s = fmaf(e.x, x1.z, s); s = fmaf(e.y, x1.w, s);
  return s;
}
template <>
__device__ __forceinline__ float dot16<float>(const uint4& w, const float* x) {
  const float4 xv = *reinterpret_cast<const float4*>(x);
  float s = __uint_as_float(w.x) * xv.x;
  s = fmaf(__uint_as_float(w.y), xv.y, s); s = fmaf(__uint_as_float(w.z), xv.z, s);
  return fmaf(__uint_as_float(w.w), xv.w, s);
}

// Consume one weight stream of nrows x K elements (the instruction's next stream in the ring, or
// straight from global memory under the direct-loads ablation): acc[r] = W[r] . xs for r < nrows.
template <typename T>
__device__ void gemv_stream(mvm_ctx& c, const T* gsrc, int nrows, int K, float* acc) {
  constexpr int EPP = 16 / sizeof(T);            // elements per 16-byte piece
  constexpr int CHUNK = STAGE_BYTES / sizeof(T);
  for (int r = c.tid; r < nrows; r += NCT) acc[r] = 0.f;
  const long total = (long)nrows * K;
  int par = 0;
  for (long c0 = 0; c0 < total; c0 += CHUNK, par ^= 1) {
    const int n = (int)(total - c0 < CHUNK ? total - c0 : CHUNK);
    const T* w = c.direct ? gsrc + c0 : reinterpret_cast<const T*>(ring_acquire(c));
    float* part = c.s.part[par];
    const int np = n / EPP;
    int col = (int)((c0 + (long)c.tid * EPP) % K);
    const int step = (NCT * EPP) % K;
    for (int p = c.tid; p < np; p += NCT) {
      const uint4 wv = c.direct ? __ldcs(reinterpret_cast<const uint4*>(w) + p) : reinterpret_cast<const uint4*>(w)[p];
      part[p] = dot16<T>(wv, c.s.xs + col);
      col += step;
      if (col >= K) col -= K;
    }
    consumer_sync();
    if (!c.direct) ring_release(c);
    // rows touched by this chunk, one warp per row, pieces summed in a fixed order
    const long r_first = c0 / K, r_last = (c0 + n - 1) / K;
    for (long r = r_first + c.warp; r <= r_last; r += NCW) {
      const int p_lo = (int)(((r * K > c0 ? r * K : c0) - c0) / EPP);
      const int p_hi = (int)((((r + 1) * K < c0 + n ? (r + 1) * K : c0 + n) - c0) / EPP);
      float v = 0.f;
      for (int p = p_lo + c.lane; p < p_hi; p += 32) v += part[p];
      v = warp_sum(v);
      if (c.lane == 0) acc[r] += v;
    }
  }
  consumer_sync();
}

// Dispatch on the weight dtype of stream si (its buffer is the instruction's weight operand).
__device__ __forceinline__ void gemv(mvm_ctx& c, int si, int w_buffer, int row0, int nrows, int K, float* acc) {
  const unsigned char* base = (const unsigned char*)buf(c, w_buffer) + c.ins->streams[si].byte_offset;
  if (bufinfo(c, w_buffer).dtype == MVM_BF16)
    gemv_stream<__nv_bfloat16>(c, reinterpret_cast<const __nv_bfloat16*>(base), nrows, K, acc);
  else
    gemv_stream<float>(c, reinterpret_cast<const float*>(base), nrows, K, acc);
  (void)row0;
}

// Load x (normalised by gamma, whose dtype matches the weights) into xs.
__device__ __forceinline__ void load_x_norm(mvm_ctx& c, int x_buf, int gamma_buf, int K, float eps) {
  const float* x = (const float*)buf(c, x_buf);
  if (gamma_buf < 0) { load_x<float>(c, x, nullptr, K, 0.f); return; }
  if (bufinfo(c, gamma_buf).dtype == MVM_BF16)
    load_x<__nv_bfloat16>(c, x, (const __nv_bfloat16*)buf(c, gamma_buf), K, eps);
  else
    load_x<float>(c, x, (const float*)buf(c, gamma_buf), K, eps);
}
