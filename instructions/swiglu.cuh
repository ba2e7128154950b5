// RMS_SWIGLU: h[rows] = silu(Wg[rows] @ n) * (Wu[rows] @ n), n = rmsnorm(x, gamma)
#pragma once
#include "rms_linear.cuh"

__device__ bool op_rms_swiglu(mvm_ctx& c) {
  const int row0 = pint(c, 0), nrows = pint(c, 1);
  const int wg = c.ins->inputs[2], wu = c.ins->inputs[3];
  const int K = (int)bufinfo(c, wg).shape[1];
  load_x_norm(c, c.ins->inputs[0], fused_norm(c), K, pfloat(c, PARAM_EPS), wg);
  gemv(c, 0, wg, nrows, K, c.s.acc);
  gemv(c, 1, wu, nrows, K, c.s.acc + ACC_ROWS);
  float* h = (float*)buf(c, c.ins->outputs[0]);
  for (int r = c.tid; r < nrows; r += NCT) {
    const float g = c.s.acc[r];
    h[row0 + r] = g / (1.f + expf(-g)) * c.s.acc[ACC_ROWS + r];
  }
  return true;
}
