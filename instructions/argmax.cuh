// ARGMAX: the winner over the LM-head tiles' (max, index) partials, or over every logit when given the
// logits vector (the unfused ablation); ties go to the lowest index. Under the token loop the token
// also feeds the next step. warp_argmax and emit_token serve RMS_LINEAR_ARGMAX too.
#pragma once
#include "device.cuh"

// Warp-wide (value, index) max, lowest index on ties.
__device__ __forceinline__ void warp_argmax(float& v, int& i) {
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, v, o);
    const int oi = __shfl_xor_sync(0xffffffffu, i, o);
    if (ov > v || (ov == v && oi < i)) { v = ov; i = oi; }
  }
}

// The token ARGMAX found: to its output, and to the token loop's feed.
__device__ __forceinline__ void emit_token(mvm_ctx& c, int tok) {
  *(int*)buf(c, ARGMAX::token(c.ins)) = tok;
  if (c.a.seq && c.step + 1 >= c.a.n_prompt) c.a.seq[c.step + 1] = tok;
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
  const int bb = ARGMAX::best(c.ins);
  const mvm_buffer_t& in = bufinfo(c, bb);
  if (in.ndim == 1) return argmax_logits(c, (const float*)buf(c, bb), (int)in.shape[0]);
  const int ntiles = (int)in.shape[0];
  const float* best = (const float*)buf(c, bb);
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
