// LINEAR: y[b, rows] = act(W[rows] @ x[b] + bias[rows] + mult * res[b, rows]) for batch rows
// b0 .. b0 + nb; bias and res are buffer ids, -1 when absent. One batch row streams its weight rows
// through the ring (the instruction's stream 0); several read them directly, once per batch row.
#pragma once
#include "activations.cuh"
#include "tiles.cuh"

// acc[0:nrows] = W[row0:row0 + nrows] @ xs, reading the rows straight from global memory.
__device__ __forceinline__ void gemv_rows_direct(mvm_ctx& c, int w, int row0, int nrows, int K) {
  const bool was = c.direct;
  c.direct = true;
  const int kp = gemv_kp(c, w);
  if (bufinfo(c, w).dtype == MVM_BF16)
    gemv_stream<__nv_bfloat16>(c, (const __nv_bfloat16*)buf(c, w) + (long)row0 * K, nrows, K, kp, c.s.acc);
  else
    gemv_stream<float>(c, (const float*)buf(c, w) + (long)row0 * K, nrows, K, kp, c.s.acc);
  c.direct = was;
}

__device__ bool op_linear(mvm_ctx& c) {
  using Op = LINEAR;
  const int row0 = Op::row0(c.ins), nrows = Op::nrows(c.ins), b0 = Op::b0(c.ins), nb = Op::nb(c.ins);
  const int act = Op::act(c.ins), w = Op::w(c.ins), bias = Op::bias(c.ins), res = Op::res(c.ins);
  const float mult = Op::mult(c.ins);
  const int N = (int)bufinfo(c, w).shape[0], K = (int)bufinfo(c, w).shape[1];
  const float* x = (const float*)buf(c, Op::x(c.ins));
  const float* rs = res >= 0 ? (const float*)buf(c, res) : nullptr;
  float* y = (float*)buf(c, Op::y(c.ins));
  for (int b = b0; b < b0 + nb; ++b) {
    load_x(c, x + (long)b * K, false, K, 0.f, xs_split(c, w));
    if (nb == 1)
      gemv(c, 0, w, nrows, K, c.s.acc);
    else
      gemv_rows_direct(c, w, row0, nrows, K);
    for (int r = c.tid; r < nrows; r += NCT) {
      const long i = (long)b * N + row0 + r;
      float v = c.s.acc[r];
      if (bias >= 0) v += weight_at(c, bias, row0 + r);
      if (rs) v += mult * __ldcg(rs + i);
      y[i] = activate(act, v);
    }
  }
  return true;
}
