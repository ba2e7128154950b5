// Rotary position embedding on rows in interleaved pairs: rows (2i, 2i+1) of a head rotate by
// pos * freqs[i] (instructions/rotary.py).
#pragma once
#include "device.cuh"

static_assert(ACC_ROWS <= 2 * NCT, "one RoPE pair per consumer thread");

// The frequency of this thread's row pair (2 tid, 2 tid + 1), loaded before the rows stream in.
__device__ __forceinline__ float rope_freq(const mvm_ctx& c, int row0, int nrows, int head_dim, const float* freqs) {
  const int r = 2 * c.tid;
  return r < nrows ? freqs[((row0 + r) % head_dim) / 2] : 0.f;
}

// One row pair (a, b) rotated by pos * freq.
__device__ __forceinline__ float2 rotate_pair(float a, float b, int pos, float freq) {
  float sn, cs;
  sincosf((float)pos * freq, &sn, &cs);
  return make_float2(a * cs - b * sn, b * cs + a * sn);
}
// Rows (r, r + 1) of interleaved heads of head_dim, rotated by pos * freqs[their pair].
__device__ __forceinline__ float2 rope_pair(float a, float b, int r, int hd, int pos, const float* freqs) {
  return rotate_pair(a, b, pos, freqs[(r % hd) / 2]);
}

// Rotate acc[0:nrows] in place (rows row0.. of interleaved heads of head_dim) by pos * freq.
__device__ __forceinline__ void rope_rows(mvm_ctx& c, int nrows, int pos, float freq) {
  const int r = 2 * c.tid;
  if (r < nrows) {
    const float2 v = rotate_pair(c.s.acc[r], c.s.acc[r + 1], pos, freq);
    c.s.acc[r] = v.x;
    c.s.acc[r + 1] = v.y;
  }
  consumer_sync();
}
