// LINEAR: y[rows] = W[rows] @ a (the unfused ablation of LINEAR_RESIDUAL).
#pragma once
#include "tiles.cuh"

__device__ bool op_linear(mvm_ctx& c) {
  const int row0 = LINEAR::row0(c.ins), nrows = LINEAR::nrows(c.ins);
  const int w = LINEAR::w(c.ins);
  const int K = (int)bufinfo(c, w).shape[1];
  load_x_norm(c, LINEAR::a(c.ins), false, K, 0.f, w);
  gemv(c, 0, w, nrows, K, c.s.acc);
  store_rows(c, LINEAR::y(c.ins), row0, nrows);
  return true;
}
