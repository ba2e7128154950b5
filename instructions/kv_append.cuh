// RMS_LINEAR_KV: key/value tile; RoPE (keys) then append at cache[head, pos, d].
#pragma once
#include "rope.cuh"

template <typename T>
__device__ void kv_store(mvm_ctx& c, T* cache, int row0, int nrows, int hd, long cap, int pos) {
  for (int r = c.tid; r < nrows; r += NCT) {
    const int R = row0 + r;
    cache[((long)(R / hd) * cap + pos) * hd + R % hd] = from_f<T>(c.s.acc[r]);
  }
}

__device__ bool op_rms_linear_kv(mvm_ctx& c) {
  const int row0 = pint(c, 0), nrows = pint(c, 1), hd = pint(c, 3), rope = pint(c, 4);
  const int cb = c.ins->outputs[0];
  const long cap = bufinfo(c, cb).shape[1];
  const int pos = input_pos(c);
  if (pos < 0 || pos >= cap) {
    if (c.tid == 0) mvm_fail(c.a, MVM_ERR_BAD_INPUT, c.block, c.qpos, c.ins, -1, (uint32_t)pos, (uint32_t)cap);
    return false;
  }
  const float freq = rope ? rope_freq(c, row0, nrows, hd, (const float*)buf(c, c.ins->inputs[4])) : 0.f;
  rms_gemv(c, nrows, pfloat(c, 2));
  if (rope) rope_rows(c, nrows, pos, freq);
  if (bufinfo(c, cb).dtype == MVM_BF16)
    kv_store(c, (__nv_bfloat16*)buf(c, cb), row0, nrows, hd, cap, pos);
  else
    kv_store(c, (float*)buf(c, cb), row0, nrows, hd, cap, pos);
  return true;
}
