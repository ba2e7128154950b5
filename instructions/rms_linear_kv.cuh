// RMS_LINEAR_KV: a key or value tile; its bias and head norm where present, RoPE (keys), then append at
// cache[head, pos, d]. Also RMS_LINEAR_AMAX's body (OpSpec.body: one inline GEMV in the main loop): the
// finished rows to y and their largest magnitude to amax[tile], for KV_QUANT.
#pragma once
#include "kv_cache.cuh"
#include "lora.cuh"
#include "qkv.cuh"

// RMS_LINEAR_AMAX's epilogue: y[0:nrows] = acc, *amax = max |acc| (out of line: inlined into the main
// loop's copy of this body, it made ptxas spill 240 bytes there).
__device__ __noinline__ void store_amax(const float* acc, float* y, float* amax, int nrows, int tid, int warp, int lane) {
  for (int r = tid; r < nrows; r += NCT) y[r] = acc[r];
  if (warp != 0) return;
  float m = 0.f;
  for (int r = lane; r < nrows; r += 32) m = fmaxf(m, fabsf(acc[r]));
  for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
  if (lane == 0) *amax = m;
}

__device__ bool op_rms_linear_kv(mvm_ctx& c) {
  using Op = RMS_LINEAR_KV;
  const int row0 = Op::row0(c.ins), nrows = Op::nrows(c.ins), hd = Op::head_dim(c.ins), rope = Op::rope(c.ins);
  const int cb = Op::cache(c.ins);
  const bool amax = c.ins->opcode == MVM_OP_RMS_LINEAR_AMAX;       // output 0 is y: KV_QUANT bounds pos
  const long cap = amax ? 0 : bufinfo(c, cb).shape[1];
  const int pos = input_pos(c);
  if (!amax && !input_in_range(c, pos, cap)) return false;
  const float freq = rope ? rope_freq(c, row0, nrows, hd, (const float*)buf(c, Op::freqs(c.ins))) : 0.f;
  // what the epilogue needs, read before the rows stream (act_out): the cache and this step's rows
  void* const cache = amax ? nullptr : buf(c, cb);
  const bool bf16 = !amax && bufinfo(c, cb).dtype == MVM_BF16;
  const int rb = amax ? -1 : Op::row(c.ins);
  const act_out row = out_of(c, rb);
  const int bias = Op::bias(c.ins), hn = Op::head_norm(c.ins);
  const float eps = Op::eps(c.ins);
  const bool lora = Op::lora_u(c.ins) >= 0;      // LoRA's fields after the rows only with LoRA
  const int aid = lora_begin(c, Op::adapter(c.ins));
  const float rstd = rms_gemv<Op>(c, nrows, Op::lora_b(c.ins), aid, row0);
  if (lora && !lora_add(c, Op::lora_u(c.ins), Op::lora_b(c.ins), aid, Op::lora_off(c.ins), row0, nrows, rstd, 1))
    return false;
  qkv_epilogue(c, bias, hn, row0, nrows, hd, eps);
  if (rope) rope_rows(c, nrows, pos, freq);
  if (amax) {
    using Am = RMS_LINEAR_AMAX;
    store_amax(c.s.acc, (float*)buf(c, Am::y(c.ins)) + row0, (float*)buf(c, Am::amax(c.ins)) + Am::tile(c.ins), nrows,
               c.tid, c.warp, c.lane);
    return true;
  }
  if (bf16)
    kv_store(c, (__nv_bfloat16*)cache, row0, nrows, hd, cap, pos);
  else
    kv_store(c, (float*)cache, row0, nrows, hd, cap, pos);
  if (rb >= 0) store_rows(c, row, row0, nrows);   // this step's rows for the partials, as tagged words
  return true;
}
