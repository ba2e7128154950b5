// The q/k/v tiles' epilogue before RoPE (instructions/qkv.py): acc[0:nrows] plus the bias of rows
// row0.., then each whole head RMS-normalised and scaled by head_norm; bias and head_norm are buffer
// ids, -1 where the model has none. Ends with a consumer_sync where it wrote acc.
#pragma once
#include "rotary.cuh"
#include "tagged.cuh"
#include "tiles.cuh"

// Each whole head of acc[0:nrows] RMS-normalised and scaled by weight(i), i < hd; ends with a
// consumer_sync. The one arithmetic of a head norm, wherever its weight is read from.
template <typename Weight>
__device__ __forceinline__ void norm_heads(mvm_ctx& c, int nrows, int hd, float eps, Weight weight) {
  for (int h = c.warp; h < nrows / hd; h += NCW) {
    float* y = c.s.acc + h * hd;
    float ss = 0.f;
    for (int i = c.lane; i < hd; i += 32) ss += y[i] * y[i];
    const float rstd = rsqrtf(warp_sum(ss) / (float)hd + eps);
    for (int i = c.lane; i < hd; i += 32) y[i] = y[i] * rstd * weight(i);
  }
  consumer_sync();
}

// The finishing ROPE / KV_APPEND (rows another task projected), when they carry a bias or head norm.
// Before the wait (weights never wait): xs[0:hd] = the head norm's weight, xs[hd:hd + hd/2] = the RoPE
// frequencies, xs[2 hd:2 hd + nrows] = the rows' bias.
__device__ __forceinline__ void finish_prewait(mvm_ctx& c, int row0, int nrows, int hd, int freqs, int bias,
                                               int head_norm) {
  if (bias < 0 && head_norm < 0) return;
  float* xs = c.s.xs;
  const float* f = (const float*)buf(c, freqs);
  for (int i = c.tid; i < hd; i += NCT) {
    if (head_norm >= 0) xs[i] = weight_at(c, head_norm, i);
    if (2 * i < hd) xs[hd + i] = f[i];
  }
  if (bias >= 0)
    for (int r = c.tid; r < nrows; r += NCT) xs[2 * hd + r] = weight_at(c, bias, row0 + r);
}

// After the wait: acc[0:nrows] = rows row0.. of activation a (tagged or plain) with their bias, each whole
// head normed, then rotated at pos when rope; the arithmetic of qkv_epilogue and rope_rows, so the rows
// equal the tiles' own.
__device__ void finish_rows(mvm_ctx& c, int a, int row0, int nrows, int hd, float eps, bool bias, bool norm,
                            bool rope, int pos) {
  const float* xs = c.s.xs;
  const float* base = (const float*)buf(c, a);
  const bool at = buf_tagged(c, a);
  for (int r = c.tid; r < nrows; r += NCT) {
    const float v = act_at(c, a, base, at, row0 + r);
    c.s.acc[r] = bias ? v + xs[2 * hd + r] : v;
  }
  consumer_sync();
  if (norm) norm_heads(c, nrows, hd, eps, [xs](int i) { return xs[i]; });
  if (rope) rope_rows(c, nrows, pos, xs[hd + ((row0 + 2 * c.tid) % hd) / 2]);
}

__device__ void qkv_epilogue(mvm_ctx& c, int bias, int head_norm, int row0, int nrows, int hd, float eps) {
  if (bias >= 0) {
    for (int r = c.tid; r < nrows; r += NCT) c.s.acc[r] += weight_at(c, bias, row0 + r);
    consumer_sync();
  }
  if (head_norm >= 0)                            // the tile holds whole heads (the validator checks)
    norm_heads(c, nrows, hd, eps, [&c, head_norm](int i) { return weight_at(c, head_norm, i); });
}
