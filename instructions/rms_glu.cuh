// RMS_GLU: h[rows] = act(Wg[rows] @ n) * (Wu[rows] @ n), n = rmsnorm(x, gamma); with LoRA, each
// half's low-rank term, and the partial product of the down projection's A with the rows of h.
#pragma once
#include "activations.cuh"
#include "lora.cuh"
#include "tiles.cuh"

__device__ bool op_rms_glu(mvm_ctx& c) {
  using Op = RMS_GLU;
  const int row0 = Op::row0(c.ins), nrows = Op::nrows(c.ins), act = Op::act(c.ins);
  const int wg = Op::wg(c.ins), wu = Op::wu(c.ins);
  const int K = (int)bufinfo(c, wg).shape[1];
  // what the epilogue needs, read before the rows stream (act_out); LoRA's fields after it only with LoRA
  const act_out h = out_of(c, Op::h(c.ins));
  const float lim = Op::limit(c.ins);
  const bool lora = Op::lora_u(c.ins) >= 0 || Op::next_a(c.ins) >= 0;
  const int aid = lora_begin(c, Op::adapter(c.ins));
  const float rstd = load_x_norm(c, Op::x(c.ins), Op::norm(c.ins) != 0, K, Op::eps(c.ins), wg);
  lora_prefetch_b(c, Op::lora_b(c.ins), aid, row0, nrows, 2);
  lora_prefetch_a(c, Op::next_a(c.ins), aid, row0, nrows);
  gemv(c, 0, wg, nrows, K, c.s.acc);
  // up multiplies the same x: where gate's GEMV took a 4-bit tensor-core path, up's (a weight of the same format
  // and shape takes the same path) reuses the B fragments it built (gemv_f8.cuh, gemv_imma.cuh)
  const mvm_buffer_t &gi = bufinfo(c, wg), &ui = bufinfo(c, wu);
  gemv(c, 1, wu, nrows, K, c.s.acc + ACC_ROWS, 0, 0,
       gi.dtype == ui.dtype && gi.ndim == ui.ndim && (gi.scale >= 0) == (ui.scale >= 0) ? 1 : 0);
  if (lora && !lora_add(c, Op::lora_u(c.ins), Op::lora_b(c.ins), aid, Op::lora_off(c.ins), row0, nrows, rstd, 2))
    return false;
  if (h.tagged) tag_release();
  const bool keep = lora && Op::next_a(c.ins) >= 0;   // a LoRA producer: its product follows
  for (int r = c.tid; r < nrows; r += NCT) {
    const float v = glu(act, c.s.acc[r], c.s.acc[ACC_ROWS + r], lim);
    act_store(h.p, h.tagged, row0 + r, v, step_tag(c));
    if (keep) c.s.acc[r] = v;                    // kept for the LoRA product below
  }
  if (!keep) return true;
  consumer_sync();
  return lora_produce(c, Op::next_a(c.ins), Op::next_u(c.ins), aid, Op::lora_t(c.ins), row0, c.s.acc,
                      Op::h(c.ins), h.p, row0, nrows);
}
