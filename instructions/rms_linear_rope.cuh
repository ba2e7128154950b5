// RMS_LINEAR_ROPE: the query tile, W[rows] @ rmsnorm(x), its bias and head norm where present, rotated
// at position pos.
#pragma once
#include "lora.cuh"
#include "qkv.cuh"
#include "rotary.cuh"

__device__ bool op_rms_linear_rope(mvm_ctx& c) {
  using Op = RMS_LINEAR_ROPE;
  const int row0 = Op::row0(c.ins), nrows = Op::nrows(c.ins), hd = Op::head_dim(c.ins);
  const float freq = rope_freq(c, row0, nrows, hd, (const float*)buf(c, Op::freqs(c.ins)));
  const int aid = lora_begin(c, Op::adapter(c.ins));
  const float rstd = rms_gemv<Op>(c, nrows, Op::lora_b(c.ins), aid, row0);
  if (!lora_add(c, Op::lora_u(c.ins), Op::lora_b(c.ins), aid, Op::lora_off(c.ins), row0, nrows, rstd, 1))
    return false;
  qkv_epilogue(c, Op::bias(c.ins), Op::head_norm(c.ins), row0, nrows, hd, Op::eps(c.ins));
  rope_rows(c, nrows, input_pos(c), freq);
  store_rows(c, Op::y(c.ins), row0, nrows);
  return true;
}
