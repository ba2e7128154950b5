// RMS_LINEAR_ARGMAX: LM-head tile -> logits[rows] and best[tile] = (max, index); ties go to the
// lowest index.
#pragma once
#include "argmax.cuh"
#include "tiles.cuh"

__device__ bool op_rms_linear_argmax(mvm_ctx& c) {
  using Op = RMS_LINEAR_ARGMAX;
  const int row0 = Op::row0(c.ins), nrows = Op::nrows(c.ins), tile = Op::tile(c.ins);
  const act_out logits = out_of(c, Op::logits(c.ins));  // read before the rows stream (act_out)
  float* best = (float*)buf(c, Op::best(c.ins));
  rms_gemv<Op>(c, nrows);
  store_rows(c, logits, row0, nrows);
  if (c.warp == 0) {
    float v = -INFINITY;
    int i = 0x7fffffff;
    for (int r = c.lane; r < nrows; r += 32)
      if (c.s.acc[r] > v) { v = c.s.acc[r]; i = r; }
    warp_argmax(v, i);
    if (c.lane == 0) {
      best[2 * tile] = v;
      best[2 * tile + 1] = (float)(row0 + i);
    }
  }
  return true;
}
