// RMS_LINEAR_KV: a key or value tile; its bias and head norm where present, RoPE (keys), then append at
// cache[head, pos, d].
#pragma once
#include "kv_cache.cuh"
#include "lora.cuh"
#include "qkv.cuh"

__device__ bool op_rms_linear_kv(mvm_ctx& c) {
  using Op = RMS_LINEAR_KV;
  const int row0 = Op::row0(c.ins), nrows = Op::nrows(c.ins), hd = Op::head_dim(c.ins), rope = Op::rope(c.ins);
  const int cb = Op::cache(c.ins);
  const long cap = bufinfo(c, cb).shape[1];
  const int pos = input_pos(c);
  if (!input_in_range(c, pos, cap)) return false;
  const float freq = rope ? rope_freq(c, row0, nrows, hd, (const float*)buf(c, Op::freqs(c.ins))) : 0.f;
  const int aid = lora_begin(c, Op::adapter(c.ins));
  const float rstd = rms_gemv<Op>(c, nrows, Op::lora_b(c.ins), aid, row0);
  if (!lora_add(c, Op::lora_u(c.ins), Op::lora_b(c.ins), aid, Op::lora_off(c.ins), row0, nrows, rstd, 1))
    return false;
  qkv_epilogue(c, Op::bias(c.ins), Op::head_norm(c.ins), row0, nrows, hd, Op::eps(c.ins));
  if (rope) rope_rows(c, nrows, pos, freq);
  if (bufinfo(c, cb).dtype == MVM_BF16)
    kv_store(c, (__nv_bfloat16*)buf(c, cb), row0, nrows, hd, cap, pos);
  else
    kv_store(c, (float*)buf(c, cb), row0, nrows, hd, cap, pos);
  return true;
}
