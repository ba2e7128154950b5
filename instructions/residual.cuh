// LINEAR_RESIDUAL: y[rows] = res[rows] + W[rows] @ a; a is a vector, or attention partials that are
// combined into shared memory on load (the o-projection with the combine fused in).
// LINEAR and ADD: the unfused pair (ablation), y[rows] = W[rows] @ a, then y[rows] = a[rows] + b[rows].
#pragma once
#include "../vm/kernel/gemv.cuh"
#include "attention.cuh"

__device__ bool op_linear_residual(mvm_ctx& c) {
  const int row0 = pint(c, 0), nrows = pint(c, 1);
  const int w = c.ins->inputs[1];
  const int K = (int)bufinfo(c, w).shape[1];
  PROBE_BEGIN;
  // the residual is ready (the wait covers it): its load flies while x loads and the rows stream
  const float* res = (const float*)buf(c, c.ins->inputs[2]);
  const float res0 = c.tid < nrows ? __ldcg(res + row0 + c.tid) : 0.f;
  const mvm_buffer_t& ainfo = bufinfo(c, c.ins->inputs[0]);
  if (ainfo.ndim == 4)
    combine_heads(c, (const float*)buf(c, c.ins->inputs[0]), (int)ainfo.shape[1], (int)ainfo.shape[2],
                  (int)ainfo.shape[3], 0, (int)ainfo.shape[0], c.s.xs, c.s.xs + K, xs_split(c, w));
  else
    load_x_norm(c, c.ins->inputs[0], false, K, 0.f, w);
  PROBE_PHASE;
  gemv(c, 0, w, nrows, K, c.s.acc);
  PROBE_PHASE;
  float* y = (float*)buf(c, c.ins->outputs[0]);
  for (int r = c.tid; r < nrows; r += NCT) y[row0 + r] = (r == c.tid ? res0 : __ldcg(res + row0 + r)) + c.s.acc[r];
  PROBE_PHASE;
  PROBE_REPORT("LINEAR_RESIDUAL(load_x,gemv,store)", K, 37);
  return true;
}

__device__ bool op_linear(mvm_ctx& c) {
  const int row0 = pint(c, 0), nrows = pint(c, 1);
  const int w = c.ins->inputs[1];
  const int K = (int)bufinfo(c, w).shape[1];
  load_x_norm(c, c.ins->inputs[0], false, K, 0.f, w);
  gemv(c, 0, w, nrows, K, c.s.acc);
  float* y = (float*)buf(c, c.ins->outputs[0]);
  for (int r = c.tid; r < nrows; r += NCT) y[row0 + r] = c.s.acc[r];
  return true;
}

// a + b in that order, as LINEAR_RESIDUAL adds res + acc: the same f32 sums.
__device__ bool op_add(mvm_ctx& c) {
  const int row0 = pint(c, 0), nrows = pint(c, 1);
  const float* a = (const float*)buf(c, c.ins->inputs[0]);
  const float* b = (const float*)buf(c, c.ins->inputs[1]);
  float* y = (float*)buf(c, c.ins->outputs[0]);
  for (int r = row0 + c.tid; r < row0 + nrows; r += NCT) y[r] = __ldcg(a + r) + __ldcg(b + r);
  return true;
}
