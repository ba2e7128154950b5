// RMS_LINEAR_ARGMAX: LM-head tile -> logits[rows] and best[tile] = (max, index);
// ARGMAX: the winner over tiles, or over every logit when given the logits vector (the unfused
// ablation). Ties go to the lowest index.
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
  const int row0 = pint(c, 0), nrows = pint(c, 1), tile = pint(c, 4);
  rms_gemv(c, nrows);
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

// The token ARGMAX found: to next_token, and to the token loop's feed.
__device__ __forceinline__ void emit_token(mvm_ctx& c, int tok) {
  *(int*)buf(c, c.ins->outputs[0]) = tok;
  if (c.a.seq && c.step + 1 >= c.a.n_prompt) c.a.seq[c.step + 1] = tok;  // the token loop's feed
}

// Every consumer thread scans a strided share of the logits; warps' winners meet in warp order.
__device__ bool argmax_logits(mvm_ctx& c, const float* logits, int n) {
  float v = -INFINITY;
  int i = 0x7fffffff;
  for (int r = c.tid; r < n; r += NCT) {
    const float x = __ldcg(logits + r);
    if (x > v) { v = x; i = r; }
  }
  warp_argmax(v, i);
  if (c.lane == 0) {
    c.s.red[c.warp] = v;
    c.s.red[NCW + c.warp] = __int_as_float(i);
  }
  consumer_sync();
  if (c.tid == 0) {
    for (int w = 1; w < NCW; ++w) {
      const float ov = c.s.red[w];
      const int oi = __float_as_int(c.s.red[NCW + w]);
      if (ov > v || (ov == v && oi < i)) { v = ov; i = oi; }
    }
    emit_token(c, i);
  }
  return true;
}

__device__ bool op_argmax(mvm_ctx& c) {
  const mvm_buffer_t& in = bufinfo(c, c.ins->inputs[0]);
  if (in.ndim == 1) return argmax_logits(c, (const float*)buf(c, c.ins->inputs[0]), (int)in.shape[0]);
  const int ntiles = (int)in.shape[0];
  const float* best = (const float*)buf(c, c.ins->inputs[0]);
  if (c.warp == 0) {
    float v = -INFINITY;
    int i = 0x7fffffff;
    for (int t = c.lane; t < ntiles; t += 32) {
      const float bv = __ldcg(best + 2 * t);
      if (bv > v) { v = bv; i = t; }
    }
    warp_argmax(v, i);
    if (c.lane == 0) emit_token(c, (int)__ldcg(best + 2 * i + 1));
  }
  return true;
}
