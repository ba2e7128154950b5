// RMS_GLU: h[rows] = act(Wg[rows] @ n) * (Wu[rows] @ n), n = rmsnorm(x, gamma)
#pragma once
#include "activations.cuh"
#include "tiles.cuh"

__device__ bool op_rms_glu(mvm_ctx& c) {
  using Op = RMS_GLU;
  const int row0 = Op::row0(c.ins), nrows = Op::nrows(c.ins), act = Op::act(c.ins);
  const int wg = Op::wg(c.ins), wu = Op::wu(c.ins);
  const int K = (int)bufinfo(c, wg).shape[1];
  load_x_norm(c, Op::x(c.ins), Op::norm(c.ins) != 0, K, Op::eps(c.ins), wg);
  gemv(c, 0, wg, nrows, K, c.s.acc);
  gemv(c, 1, wu, nrows, K, c.s.acc + ACC_ROWS);
  float* h = (float*)buf(c, Op::h(c.ins));
  for (int r = c.tid; r < nrows; r += NCT) h[row0 + r] = activate(act, c.s.acc[r]) * c.s.acc[ACC_ROWS + r];
  return true;
}
