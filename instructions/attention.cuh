// ATTN_PARTIAL: one (KV head, KV block) of decode attention -> (m, l, acc) per query head of the group.
// ATTN_COMBINE: merge the blocks of one KV head in block order.
#pragma once
#include "../vm/kernel/device.cuh"

#define MVM_MAX_GROUP 16

template <typename T> __device__ __forceinline__ float ld_cg(const T* p);
template <> __device__ __forceinline__ float ld_cg<float>(const float* p) { return __ldcg(p); }
template <> __device__ __forceinline__ float ld_cg<__nv_bfloat16>(const __nv_bfloat16* p) {
  return __uint_as_float(((uint32_t)__ldcg(reinterpret_cast<const unsigned short*>(p))) << 16);
}

template <typename T>
__device__ void attn_partial_impl(mvm_ctx& c, const float* q, const T* kc, const T* vc, float* part, int h,
                                  int b, int bs, float scale, int G, int hd, long cap, int nblk, int pos) {
  const int W = hd + 2;
  float* out = part + ((long)h * nblk + b) * G * W;
  const int lo = b * bs, hi = min((b + 1) * bs, pos + 1);
  if (hi <= lo) {
    for (int i = c.tid; i < G * W; i += NCT) out[i] = (i % W == 0) ? -INFINITY : 0.f;
    return;
  }
  const int n = hi - lo;
  float* qs = c.s.xs;              // [G][hd], pre-scaled
  float* sc = c.s.xs + G * hd;     // [G][n]
  for (int i = c.tid; i < G * hd; i += NCT) qs[i] = __ldcg(q + (long)h * G * hd + i) * scale;
  consumer_sync();
  const T* kh = kc + ((long)h * cap + lo) * hd;
  const T* vh = vc + ((long)h * cap + lo) * hd;
  for (int j = c.warp; j < n; j += NCW) {
    float s[MVM_MAX_GROUP];
#pragma unroll
    for (int g = 0; g < MVM_MAX_GROUP; ++g) s[g] = 0.f;
    for (int d = c.lane; d < hd; d += 32) {
      const float k = ld_cg(kh + (long)j * hd + d);
#pragma unroll
      for (int g = 0; g < MVM_MAX_GROUP; ++g)
        if (g < G) s[g] = fmaf(qs[g * hd + d], k, s[g]);
    }
#pragma unroll
    for (int g = 0; g < MVM_MAX_GROUP; ++g)
      if (g < G) {
        const float t = warp_sum(s[g]);
        if (c.lane == 0) sc[g * n + j] = t;
      }
  }
  consumer_sync();
  for (int g = c.warp; g < G; g += NCW) {
    float m = -INFINITY;
    for (int j = c.lane; j < n; j += 32) m = fmaxf(m, sc[g * n + j]);
    m = warp_max(m);
    float l = 0.f;
    for (int j = c.lane; j < n; j += 32) {
      const float e = expf(sc[g * n + j] - m);
      sc[g * n + j] = e;
      l += e;
    }
    l = warp_sum(l);
    if (c.lane == 0) { out[g * W] = m; out[g * W + 1] = l; }
  }
  consumer_sync();
  for (int i = c.tid; i < G * hd; i += NCT) {
    const int g = i / hd, d = i % hd;
    float acc = 0.f;
    for (int j = 0; j < n; ++j) acc = fmaf(sc[g * n + j], ld_cg(vh + (long)j * hd + d), acc);
    out[g * W + 2 + d] = acc;
  }
}

__device__ bool op_attn_partial(mvm_ctx& c) {
  const int kb = c.ins->inputs[1], pb = c.ins->outputs[0];
  const mvm_buffer_t& kinfo = bufinfo(c, kb);
  const mvm_buffer_t& pinfo = bufinfo(c, pb);
  const int pos = *(const volatile int*)buf(c, c.ins->inputs[3]);
  const long cap = kinfo.shape[1];
  if (pos < 0 || pos >= cap) {
    if (c.tid == 0) mvm_fail(c.a, MVM_ERR_BAD_INPUT, c.block, c.qpos, c.ins, -1, (uint32_t)pos, (uint32_t)cap);
    return false;
  }
  const float* q = (const float*)buf(c, c.ins->inputs[0]);
  const int G = (int)pinfo.shape[2], hd = (int)kinfo.shape[2], nblk = (int)pinfo.shape[1];
  if (kinfo.dtype == MVM_BF16)
    attn_partial_impl(c, q, (const __nv_bfloat16*)buf(c, kb), (const __nv_bfloat16*)buf(c, c.ins->inputs[2]),
                      (float*)buf(c, pb), pint(c, 0), pint(c, 1), pint(c, 2), pfloat(c, 3), G, hd, cap, nblk, pos);
  else
    attn_partial_impl(c, q, (const float*)buf(c, kb), (const float*)buf(c, c.ins->inputs[2]),
                      (float*)buf(c, pb), pint(c, 0), pint(c, 1), pint(c, 2), pfloat(c, 3), G, hd, cap, nblk, pos);
  return true;
}

__device__ bool op_attn_combine(mvm_ctx& c) {
  const mvm_buffer_t& pinfo = bufinfo(c, c.ins->inputs[0]);
  const int nblk = (int)pinfo.shape[1], G = (int)pinfo.shape[2], W = (int)pinfo.shape[3], hd = W - 2;
  const int h = pint(c, 0);
  const float* part = (const float*)buf(c, c.ins->inputs[0]) + (long)h * nblk * G * W;
  float* attn = (float*)buf(c, c.ins->outputs[0]);
  for (int i = c.tid; i < G * hd; i += NCT) {
    const int g = i / hd, d = i % hd;
    float mx = -INFINITY;
    for (int b = 0; b < nblk; ++b) mx = fmaxf(mx, __ldcg(part + ((long)b * G + g) * W));
    float den = 0.f, acc = 0.f;
    for (int b = 0; b < nblk; ++b) {
      const float* p = part + ((long)b * G + g) * W;
      const float m = __ldcg(p);
      if (m == -INFINITY) continue;
      const float w = expf(m - mx);
      den = fmaf(__ldcg(p + 1), w, den);
      acc = fmaf(__ldcg(p + 2 + d), w, acc);
    }
    attn[((long)h * G + g) * hd + d] = acc / den;
  }
  return true;
}
