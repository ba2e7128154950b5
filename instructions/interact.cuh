// INTERACT: y[b] = [z[b], <t_i, t_j> for i > j, zeros], t = (z[b], e[b, 0], e[b, 1], ...)
#pragma once
#include "device.cuh"

// Pair k of the strictly lower triangle, row by row: k = i (i - 1) / 2 + j, 0 <= j < i.
__device__ __forceinline__ int2 tril_pair(int k) {
  int i = (int)((1.f + sqrtf(1.f + 8.f * (float)k)) * 0.5f);
  while (i * (i - 1) / 2 > k) --i;
  while ((i + 1) * i / 2 <= k) ++i;
  return make_int2(i, k - i * (i - 1) / 2);
}

__device__ bool op_interact(mvm_ctx& c) {
  using Op = INTERACT;
  const int zb = Op::z(c.ins), eb = Op::e(c.ins), yb = Op::y(c.ins);
  const int D = (int)bufinfo(c, zb).shape[1], S = (int)bufinfo(c, eb).shape[1];
  const int Wy = (int)bufinfo(c, yb).shape[1], n = S + 1, P = n * (n - 1) / 2;
  const float* z = (const float*)buf(c, zb);
  const float* e = (const float*)buf(c, eb);
  float* y = (float*)buf(c, yb);
  float* t = c.s.xs;                             // the 1 + S vectors of one batch row
  const int b0 = Op::b0(c.ins), nb = Op::nb(c.ins);
  for (int b = b0; b < b0 + nb; ++b) {
    for (int i = c.tid; i < n * D; i += NCT)
      t[i] = i < D ? __ldcg(z + (long)b * D + i) : __ldcg(e + ((long)b * S) * D + (i - D));
    consumer_sync();
    float* yr = y + (long)b * Wy;
    for (int i = c.tid; i < D; i += NCT) yr[i] = t[i];
    for (int k = c.tid; k < P; k += NCT) {
      const int2 ij = tril_pair(k);
      const float* a = t + ij.x * D;
      const float* v = t + ij.y * D;
      float s = 0.f;
      for (int d = 0; d < D; ++d) s = fmaf(a[d], v[d], s);
      yr[D + k] = s;
    }
    for (int i = D + P + c.tid; i < Wy; i += NCT) yr[i] = 0.f;
    consumer_sync();                             // t is rewritten for the next row
  }
  return true;
}
