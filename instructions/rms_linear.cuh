// RMS_LINEAR: y[row0:row0+nrows] = W[rows] @ rmsnorm(x, gamma)
#pragma once
#include "../vm/kernel/gemv.cuh"

// Every RMS_* opcode has eps at param 2 and norm at param 3: 1 normalises x in the prologue (gamma
// prefetched into xs before the wait), 0 takes x as normalised by an RMSNORM task (the ablation).
constexpr int PARAM_EPS = 2, PARAM_NORM = 3;
__device__ __forceinline__ bool fused_norm(const mvm_ctx& c) { return c.ins->params[PARAM_NORM] != 0; }

// The shared prologue + body of every normed projection: acc[0:nrows] = W[rows] @ rmsnorm(x).
__device__ __forceinline__ void rms_gemv(mvm_ctx& c, int nrows) {
  const int w = c.ins->inputs[2];
  const int K = (int)bufinfo(c, w).shape[1];
  load_x_norm(c, c.ins->inputs[0], fused_norm(c), K, pfloat(c, PARAM_EPS), w);
  gemv(c, 0, w, nrows, K, c.s.acc);
}

__device__ bool op_rms_linear(mvm_ctx& c) {
  const int row0 = pint(c, 0), nrows = pint(c, 1);
  rms_gemv(c, nrows);
  float* y = (float*)buf(c, c.ins->outputs[0]);
  for (int r = c.tid; r < nrows; r += NCT) y[row0 + r] = c.s.acc[r];
  return true;
}
