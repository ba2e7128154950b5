// RMS_LINEAR_ARGMAX: LM-head tile -> logits[rows] and best[tile] = (max, index);
// ARGMAX: the winner over tiles. Ties go to the lowest index.
#pragma once
#include "rms_linear.cuh"

// Warp-wide (value, index) max, lowest index on ties.
__device__ __forceinline__ void warp_argmax(float& v, int& i) {
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, v, o);
    const int oi = __shfl_xor_sync(0xffffffffu, i, o);
    if (ov > v || (ov == v && oi < i)) { v = ov; i = oi; }
  }
}

__device__ bool op_rms_linear_argmax(mvm_ctx& c) {
  const int row0 = pint(c, 0), nrows = pint(c, 1), tile = pint(c, 3);
  rms_gemv(c, nrows, pfloat(c, 2));
  float* logits = (float*)buf(c, c.ins->outputs[0]);
  for (int r = c.tid; r < nrows; r += NCT) logits[row0 + r] = c.s.acc[r];
  if (c.warp == 0) {
    float v = -INFINITY;
    int i = 0x7fffffff;
    for (int r = c.lane; r < nrows; r += 32)
      if (c.s.acc[r] > v) { v = c.s.acc[r]; i = r; }
    warp_argmax(v, i);
    if (c.lane == 0) {
      float* best = (float*)buf(c, c.ins->outputs[1]);
      best[2 * tile] = v;
      best[2 * tile + 1] = (float)(row0 + i);
    }
  }
  return true;
}

__device__ bool op_argmax(mvm_ctx& c) {
  const int ntiles = (int)bufinfo(c, c.ins->inputs[0]).shape[0];
  const float* best = (const float*)buf(c, c.ins->inputs[0]);
  if (c.warp == 0) {
    float v = -INFINITY;
    int i = 0x7fffffff;
    for (int t = c.lane; t < ntiles; t += 32) {
      const float bv = __ldcg(best + 2 * t);
      if (bv > v) { v = bv; i = t; }
    }
    warp_argmax(v, i);
    if (c.lane == 0) {
      const int tok = (int)__ldcg(best + 2 * i + 1);
      *(int*)buf(c, c.ins->outputs[0]) = tok;
      if (c.a.seq && c.step + 1 >= c.a.n_prompt) c.a.seq[c.step + 1] = tok;  // the token loop's feed
    }
  }
  return true;
}
