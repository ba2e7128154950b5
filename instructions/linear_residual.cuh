// LINEAR_RESIDUAL: y[rows] = res[rows] + W[rows] @ a; a is a vector, or attention partials that are
// combined into shared memory on load (the o-projection with the combine fused in).
// With LoRA, the tile's low-rank term before the residual, and the partial product of the next
// projections' A with its rows of y.
#pragma once
#include "attention.cuh"
#include "lora.cuh"

__device__ bool op_linear_residual(mvm_ctx& c) {
  using Op = LINEAR_RESIDUAL;
  const int row0 = Op::row0(c.ins), nrows = Op::nrows(c.ins);
  const int w = Op::w(c.ins);
  const int K = (int)bufinfo(c, w).shape[1];
  // the residual is ready (the wait covers it, or its tags): its load flies while x loads and the rows stream
  const int rb = Op::res(c.ins);
  // what the epilogue needs, read before the rows stream (act_out); LoRA's fields after it only with LoRA
  const act_out y = out_of(c, Op::y(c.ins));
  const bool lora = Op::lora_u(c.ins) >= 0 || Op::next_a(c.ins) >= 0;
  const float res0 = c.tid < nrows ? act_at(c, rb, row0 + c.tid) : 0.f;
  const int aid = lora_begin(c, Op::adapter(c.ins));
  const int a = Op::a(c.ins);
  const mvm_buffer_t& ainfo = bufinfo(c, a);
  if (ainfo.ndim == 4)
    combine_heads(c, a, (int)ainfo.shape[1], (int)ainfo.shape[2], (int)ainfo.shape[3], 0,
                  (int)ainfo.shape[0], 0, (int)ainfo.shape[2], c.s.xs, c.s.xs + K, xs_split(c, w));
  else
    load_x_norm(c, a, false, K, 0.f, w);
  lora_prefetch_b(c, Op::lora_b(c.ins), aid, row0, nrows, 1);
  lora_prefetch_a(c, Op::next_a(c.ins), aid, row0, nrows);
  gemv(c, 0, w, nrows, K, c.s.acc, 0, 0, 2);     // x is done with after it (xmode 2: gemv_imma.cuh may write B over it)
  if (lora && !lora_add(c, Op::lora_u(c.ins), Op::lora_b(c.ins), aid, Op::lora_off(c.ins), row0, nrows, 1.f, 1))
    return false;
  if (y.tagged) tag_release();
  const bool keep = lora && Op::next_a(c.ins) >= 0;   // a LoRA producer: its product follows
  for (int r = c.tid; r < nrows; r += NCT) {
    const float v = (r == c.tid ? res0 : act_at(c, rb, row0 + r)) + c.s.acc[r];
    act_store(y.p, y.tagged, row0 + r, v, step_tag(c));
    if (keep) c.s.acc[r] = v;                    // kept for the LoRA product below
  }
  if (!keep) return true;
  consumer_sync();
  return lora_produce(c, Op::next_a(c.ins), Op::next_u(c.ins), aid, Op::lora_t(c.ins), row0, c.s.acc,
                      Op::y(c.ins), y.p, row0, nrows, Op::next_gamma(c.ins));
}
