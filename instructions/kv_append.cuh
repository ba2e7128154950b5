// KV_APPEND: rows of a vector another task wrote, with their bias and head norm where present (RoPE
// next, for keys), appended to the KV cache at position pos (the unfused form of RMS_LINEAR_KV's
// epilogue; the finisher of short k tiles).
#pragma once
#include "kv_cache.cuh"
#include "qkv.cuh"

__device__ bool op_kv_append(mvm_ctx& c) {
  using Op = KV_APPEND;
  const int row0 = Op::row0(c.ins), nrows = Op::nrows(c.ins), hd = Op::head_dim(c.ins), rope = Op::rope(c.ins);
  const int cb = Op::cache(c.ins);
  const long cap = bufinfo(c, cb).shape[1];
  const int pos = input_pos(c);
  if (!input_in_range(c, pos, cap)) return false;
  const int ab = Op::a(c.ins), rb = Op::row(c.ins);
  const float* freqs = (const float*)buf(c, Op::freqs(c.ins));
  const bool bf16 = bufinfo(c, cb).dtype == MVM_BF16;
  if (Op::bias(c.ins) >= 0 || Op::head_norm(c.ins) >= 0) {   // finished in shared memory, as the tiles do
    finish_rows(c, ab, row0, nrows, hd, Op::eps(c.ins), Op::bias(c.ins) >= 0, Op::head_norm(c.ins) >= 0, rope != 0,
                pos);
    if (bf16)
      kv_store(c, (__nv_bfloat16*)buf(c, cb), row0, nrows, hd, cap, pos);
    else
      kv_store(c, (float*)buf(c, cb), row0, nrows, hd, cap, pos);
    if (rb >= 0) store_rows(c, rb, row0, nrows);  // this step's rows for the partials, as tagged words
    return true;
  }
  if (bf16)
    append_rows(c, ab, (__nv_bfloat16*)buf(c, cb), row0, nrows, hd, cap, pos, rope != 0, freqs, rb);
  else
    append_rows(c, ab, (float*)buf(c, cb), row0, nrows, hd, cap, pos, rope != 0, freqs, rb);
  return true;
}
