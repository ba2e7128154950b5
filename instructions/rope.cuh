// RMS_LINEAR_ROPE: the query tile; rows in interleaved pairs (2i, 2i+1) rotate by pos * freqs[i].
#pragma once
#include "rms_linear.cuh"

static_assert(ACC_ROWS <= 2 * NCT, "one RoPE pair per consumer thread");

// The frequency of this thread's row pair (2 tid, 2 tid + 1), loaded before the rows stream in.
__device__ __forceinline__ float rope_freq(const mvm_ctx& c, int row0, int nrows, int head_dim, const float* freqs) {
  const int r = 2 * c.tid;
  return r < nrows ? freqs[((row0 + r) % head_dim) / 2] : 0.f;
}

// Rotate acc[0:nrows] in place (rows row0.. of interleaved heads of head_dim) by pos * freq.
__device__ __forceinline__ void rope_rows(mvm_ctx& c, int nrows, int pos, float freq) {
  const int r = 2 * c.tid;
  if (r < nrows) {
    float sn, cs;
    sincosf((float)pos * freq, &sn, &cs);
    const float a = c.s.acc[r], b = c.s.acc[r + 1];
    c.s.acc[r] = a * cs - b * sn;
    c.s.acc[r + 1] = b * cs + a * sn;
  }
  consumer_sync();
}

__device__ bool op_rms_linear_rope(mvm_ctx& c) {
  const int row0 = pint(c, 0), nrows = pint(c, 1), hd = pint(c, 3);
  const float freq = rope_freq(c, row0, nrows, hd, (const float*)buf(c, c.ins->inputs[4]));
  rms_gemv(c, nrows, pfloat(c, 2));
  rope_rows(c, nrows, input_pos(c), freq);
  float* y = (float*)buf(c, c.ins->outputs[0]);
  for (int r = c.tid; r < nrows; r += NCT) y[row0 + r] = c.s.acc[r];
  return true;
}
