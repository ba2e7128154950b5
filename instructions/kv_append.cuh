// KV_APPEND: rows of a vector another task wrote (RoPE first, for keys) appended to the KV cache at
// position pos (the unfused ablation).
#pragma once
#include "kv_cache.cuh"

__device__ bool op_kv_append(mvm_ctx& c) {
  using Op = KV_APPEND;
  const int row0 = Op::row0(c.ins), nrows = Op::nrows(c.ins), hd = Op::head_dim(c.ins), rope = Op::rope(c.ins);
  const int cb = Op::cache(c.ins);
  const long cap = bufinfo(c, cb).shape[1];
  const int pos = input_pos(c);
  if (!input_in_range(c, pos, cap)) return false;
  const float* a = (const float*)buf(c, Op::a(c.ins));
  const float* freqs = (const float*)buf(c, Op::freqs(c.ins));
  if (bufinfo(c, cb).dtype == MVM_BF16)
    append_rows(c, a, (__nv_bfloat16*)buf(c, cb), row0, nrows, hd, cap, pos, rope != 0, freqs);
  else
    append_rows(c, a, (float*)buf(c, cb), row0, nrows, hd, cap, pos, rope != 0, freqs);
  return true;
}
