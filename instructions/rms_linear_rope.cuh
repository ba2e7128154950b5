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
  // what the epilogue needs, read before the rows stream (act_out)
  const act_out y = out_of(c, Op::y(c.ins));
  const int pos = input_pos(c), bias = Op::bias(c.ins), hn = Op::head_norm(c.ins);
  const float eps = Op::eps(c.ins);
  const bool lora = Op::lora_u(c.ins) >= 0;      // LoRA's fields after the rows only with LoRA
  const int aid = lora_begin(c, Op::adapter(c.ins));
  const float rstd = rms_gemv<Op>(c, nrows, Op::lora_b(c.ins), aid, row0);
  if (lora && !lora_add(c, Op::lora_u(c.ins), Op::lora_b(c.ins), aid, Op::lora_off(c.ins), row0, nrows, rstd, 1))
    return false;
  qkv_epilogue(c, bias, hn, row0, nrows, hd, eps);
  rope_rows(c, nrows, pos, freq);
  store_rows(c, y, row0, nrows);
  return true;
}
