// RMS_LINEAR_ROPE: the query tile; rows in interleaved pairs (2i, 2i+1) rotate by pos * freqs[i].
// ROPE: the unfused form (ablation), rotating rows of a vector another task wrote.
#pragma once
#include "rms_linear.cuh"

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

__device__ bool op_rms_linear_rope(mvm_ctx& c) {
  const int row0 = pint(c, 0), nrows = pint(c, 1), hd = pint(c, 4);
  PROBE_BEGIN;
  const float freq = rope_freq(c, row0, nrows, hd, (const float*)buf(c, c.ins->inputs[4]));
  rms_gemv(c, nrows);
  PROBE_PHASE;
  rope_rows(c, nrows, input_pos(c), freq);
  float* y = (float*)buf(c, c.ins->outputs[0]);
  for (int r = c.tid; r < nrows; r += NCT) y[row0 + r] = c.s.acc[r];
  PROBE_PHASE;
  PROBE_REPORT("RMS_LINEAR_ROPE(norm+gemv,rope+store)", hd, 29);
  return true;
}

__device__ bool op_rope(mvm_ctx& c) {
  const int row0 = pint(c, 0), nrows = pint(c, 1), hd = pint(c, 2);
  const float* a = (const float*)buf(c, c.ins->inputs[0]);
  const float* freqs = (const float*)buf(c, c.ins->inputs[2]);
  float* y = (float*)buf(c, c.ins->outputs[0]);
  const int pos = input_pos(c);
  for (int r = row0 + 2 * c.tid; r < row0 + nrows; r += 2 * NCT) {
    const float2 v = rope_pair(__ldcg(a + r), __ldcg(a + r + 1), r, hd, pos, freqs);
    y[r] = v.x;
    y[r + 1] = v.y;
  }
  return true;
}
