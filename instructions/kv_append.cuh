// RMS_LINEAR_KV: key/value tile; RoPE (keys) then append at cache[head, pos, d].
// KV_APPEND: the unfused form (ablation), appending rows of a vector another task wrote.
#pragma once
#include "rope.cuh"

template <typename T>
__device__ void kv_store(mvm_ctx& c, T* cache, int row0, int nrows, int hd, long cap, int pos) {
  for (int r = c.tid; r < nrows; r += NCT) {
    const int R = row0 + r;
    cache[((long)(R / hd) * cap + pos) * hd + R % hd] = from_f<T>(c.s.acc[r]);
  }
}

// pos inside the cache, or the launch fails with a dump naming the position and the capacity.
__device__ __forceinline__ bool pos_in_cache(mvm_ctx& c, int pos, long cap) {
  if (pos >= 0 && pos < cap) return true;
  if (c.tid == 0) mvm_fail(c.a, MVM_ERR_BAD_INPUT, c.block, c.qpos, c.ins, -1, (uint32_t)pos, (uint32_t)cap);
  return false;
}

__device__ bool op_rms_linear_kv(mvm_ctx& c) {
  const int row0 = pint(c, 0), nrows = pint(c, 1), hd = pint(c, 4), rope = pint(c, 5);
  const int cb = c.ins->outputs[0];
  const long cap = bufinfo(c, cb).shape[1];
  const int pos = input_pos(c);
  if (!pos_in_cache(c, pos, cap)) return false;
  const float freq = rope ? rope_freq(c, row0, nrows, hd, (const float*)buf(c, c.ins->inputs[4])) : 0.f;
  rms_gemv(c, nrows);
  if (rope) rope_rows(c, nrows, pos, freq);
  if (bufinfo(c, cb).dtype == MVM_BF16)
    kv_store(c, (__nv_bfloat16*)buf(c, cb), row0, nrows, hd, cap, pos);
  else
    kv_store(c, (float*)buf(c, cb), row0, nrows, hd, cap, pos);
  return true;
}

template <typename T>
__device__ void append_rows(mvm_ctx& c, const float* a, T* cache, int row0, int nrows, int hd, long cap, int pos,
                            bool rope, const float* freqs) {
  for (int r = row0 + 2 * c.tid; r < row0 + nrows; r += 2 * NCT) {
    float2 v = make_float2(__ldcg(a + r), r + 1 < row0 + nrows ? __ldcg(a + r + 1) : 0.f);
    if (rope) v = rope_pair(v.x, v.y, r, hd, pos, freqs);
    cache[((long)(r / hd) * cap + pos) * hd + r % hd] = from_f<T>(v.x);
    if (r + 1 < row0 + nrows) cache[((long)((r + 1) / hd) * cap + pos) * hd + (r + 1) % hd] = from_f<T>(v.y);
  }
}

__device__ bool op_kv_append(mvm_ctx& c) {
  const int row0 = pint(c, 0), nrows = pint(c, 1), hd = pint(c, 2), rope = pint(c, 3);
  const int cb = c.ins->outputs[0];
  const long cap = bufinfo(c, cb).shape[1];
  const int pos = input_pos(c);
  if (!pos_in_cache(c, pos, cap)) return false;
  const float* a = (const float*)buf(c, c.ins->inputs[0]);
  const float* freqs = (const float*)buf(c, c.ins->inputs[2]);
  if (bufinfo(c, cb).dtype == MVM_BF16)
    append_rows(c, a, (__nv_bfloat16*)buf(c, cb), row0, nrows, hd, cap, pos, rope != 0, freqs);
  else
    append_rows(c, a, (float*)buf(c, cb), row0, nrows, hd, cap, pos, rope != 0, freqs);
  return true;
}
