// RMS_LINEAR: y[row0:row0+nrows] = W[rows] @ rmsnorm(x, gamma)
#pragma once
#include "tiles.cuh"

__device__ bool op_rms_linear(mvm_ctx& c) {
  const int row0 = RMS_LINEAR::row0(c.ins), nrows = RMS_LINEAR::nrows(c.ins);
  const act_out y = out_of(c, RMS_LINEAR::y(c.ins));     // read before the rows stream (act_out)
  rms_gemv<RMS_LINEAR>(c, nrows);
  store_rows(c, y, row0, nrows);
  return true;
}
