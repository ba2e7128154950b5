// RMS_LINEAR_ROPE: the query tile; rows in interleaved pairs (2i, 2i+1) rotate by pos * freqs[i].
#pragma once
#include "rms_linear.cuh"

// Rotate acc[0:nrows] in place (rows row0.. of interleaved heads of head_dim).
__device__ __forceinline__ void rope_rows(mvm_ctx& c, int row0, int nrows, int head_dim, int pos, const float* freqs) {
  for (int r = 2 * c.tid; r < nrows; r += 2 * NCT) {
    const float ang = (float)pos * freqs[((row0 + r) % head_dim) / 2];
    float sn, cs;
    sincosf(ang, &sn, &cs);
    const float a = c.s.acc[r], b = c.s.acc[r + 1];
    c.s.acc[r] = a * cs - b * sn;
    c.s.acc[r + 1] = b * cs + a * sn;
  }
  consumer_sync();
}

__device__ bool op_rms_linear_rope(mvm_ctx& c) {
  const int row0 = pint(c, 0), nrows = pint(c, 1), hd = pint(c, 3);
  rms_gemv(c, nrows, pfloat(c, 2));
  const int pos = input_pos(c, c.ins->inputs[3]);
  rope_rows(c, row0, nrows, hd, pos, (const float*)buf(c, c.ins->inputs[4]));
  float* y = (float*)buf(c, c.ins->outputs[0]);
  for (int r = c.tid; r < nrows; r += NCT) y[row0 + r] = c.s.acc[r];
  return true;
}
