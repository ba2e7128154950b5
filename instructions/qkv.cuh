// The q/k/v tiles' epilogue before RoPE (instructions/qkv.py): acc[0:nrows] plus the bias of rows
// row0.., then each whole head RMS-normalised and scaled by head_norm; bias and head_norm are buffer
// ids, -1 where the model has none. Ends with a consumer_sync where it wrote acc.
#pragma once
#include "tiles.cuh"

__device__ void qkv_epilogue(mvm_ctx& c, int bias, int head_norm, int row0, int nrows, int hd, float eps) {
  if (bias >= 0) {
    for (int r = c.tid; r < nrows; r += NCT) c.s.acc[r] += weight_at(c, bias, row0 + r);
    consumer_sync();
  }
  if (head_norm >= 0) {                          // the tile holds whole heads (the validator checks)
    for (int h = c.warp; h < nrows / hd; h += NCW) {
      float* a = c.s.acc + h * hd;
      float ss = 0.f;
      for (int i = c.lane; i < hd; i += 32) ss += a[i] * a[i];
      const float rstd = rsqrtf(warp_sum(ss) / (float)hd + eps);
      for (int i = c.lane; i < hd; i += 32) a[i] = a[i] * rstd * weight_at(c, head_norm, i);
    }
    consumer_sync();
  }
}
