// EXPERT_DOWN: y[rows] = res[rows] + Ws[rows] @ hs + sum_j weights[j] * (Wd[ids[j]][rows] @ h[j]), in
// that order (the loader streams the shared rows, then the k chosen experts' rows, one run each).
#pragma once
#include "experts.cuh"
#include "gemv.cuh"

__device__ bool op_expert_down(mvm_ctx& c) {
  using Op = EXPERT_DOWN;
  const int row0 = Op::row0(c.ins), nrows = Op::nrows(c.ins);
  const int wd = Op::wd(c.ins), ids = Op::ids(c.ins);
  const int F = (int)bufinfo(c, wd).shape[2], k = (int)bufinfo(c, ids).shape[0];
  for (int j = 0; j < k; ++j)
    if (expert_id(c, ids, j, wd) < 0) return false;
  const float* h = (const float*)buf(c, Op::h(c.ins));
  const float* weights = (const float*)buf(c, Op::weights(c.ins));
  const float* res = (const float*)buf(c, Op::res(c.ins));
  float* sum = c.s.acc + ACC_ROWS;               // the tile's rows of y so far
  for (int r = c.tid; r < nrows; r += NCT) sum[r] = __ldcg(res + row0 + r);
  const int hs = Op::h_shared(c.ins), ws = Op::w_shared(c.ins);
  int si = 0;                                    // the instruction's stream the next GEMV consumes
  if (hs >= 0) {
    const int Fs = (int)bufinfo(c, hs).shape[0];
    load_x(c, (const float*)buf(c, hs), false, Fs, 0.f, xs_split(c, ws));
    gemv(c, si++, ws, nrows, Fs, c.s.acc);
    for (int r = c.tid; r < nrows; r += NCT) sum[r] += c.s.acc[r];
  }
  const bool split = xs_split(c, wd);
  for (int j = 0; j < k; ++j) {
    const int e = __ldcg((const int*)buf(c, ids) + j);
    const float wj = __ldcg(weights + j);
    load_x(c, h + (long)j * F, false, F, 0.f, split);      // ends with a consumer_sync
    gemv(c, si, wd, nrows, F, c.s.acc, e);
    for (int r = c.tid; r < nrows; r += NCT) sum[r] += wj * c.s.acc[r];
  }
  float* y = (float*)buf(c, Op::y(c.ins));
  for (int r = c.tid; r < nrows; r += NCT) y[row0 + r] = sum[r];
  return true;
}
