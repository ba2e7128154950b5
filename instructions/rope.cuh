// ROPE: rows of a vector another task wrote, rotated at position pos (the unfused ablation).
#pragma once
#include "rotary.cuh"

__device__ bool op_rope(mvm_ctx& c) {
  const int row0 = ROPE::row0(c.ins), nrows = ROPE::nrows(c.ins), hd = ROPE::head_dim(c.ins);
  const float* a = (const float*)buf(c, ROPE::a(c.ins));
  const float* freqs = (const float*)buf(c, ROPE::freqs(c.ins));
  float* y = (float*)buf(c, ROPE::y(c.ins));
  const int pos = input_pos(c);
  for (int r = row0 + 2 * c.tid; r < row0 + nrows; r += 2 * NCT) {
    const float2 v = rope_pair(__ldcg(a + r), __ldcg(a + r + 1), r, hd, pos, freqs);
    y[r] = v.x;
    y[r + 1] = v.y;
  }
  return true;
}
