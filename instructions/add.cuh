// ADD: y[rows] = a[rows] + b[rows], in that order, as LINEAR_RESIDUAL adds res + acc: the same f32 sums.
#pragma once
#include "device.cuh"

__device__ bool op_add(mvm_ctx& c) {
  const int row0 = ADD::row0(c.ins), nrows = ADD::nrows(c.ins);
  const float* a = (const float*)buf(c, ADD::a(c.ins));
  const float* b = (const float*)buf(c, ADD::b(c.ins));
  float* y = (float*)buf(c, ADD::y(c.ins));
  for (int r = row0 + c.tid; r < row0 + nrows; r += NCT) y[r] = __ldcg(a + r) + __ldcg(b + r);
  return true;
}
