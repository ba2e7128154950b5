// What the attention opcodes share: merging the partials of KV heads (ATTN_COMBINE, and
// LINEAR_RESIDUAL combining on load). A partial is [m, l, acc[0:hd]] per query head of each block
// (instructions/attention.py).
#pragma once
#include "gemv.cuh"
#include "tagged.cuh"

// Merge the blocks of KV heads [h0, h1): dst[(h G + g) hd + d] for every query head g of each.
// Block weights first (one max and one exp per block and head, in shared memory at scratch:
// attention.py's combine_scratch floats), then every output element sums its blocks with all loads
// independent. Ends with a consumer_sync. With split, dst is the GEMV's activation vector of length
// (h1 - h0) G hd in its split layout; with tag (non-zero), dst is a tagged activation
// (instructions/tagged.cuh) that takes this step's tag. The partials are buffer pb, tagged or plain.
__device__ void combine_heads(mvm_ctx& c, int pb, int nblk, int G, int W, int h0, int h1, float* dst,
                              float* scratch, int split, uint32_t tag = 0) {
  const int hd = W - 2, R = (h1 - h0) * G;     // rows: (head, query head) pairs
  float* wt = scratch;                           // [R][nblk]: m, then exp(m - max)
  float* ls = wt + R * nblk;                     // [R][nblk]: l
  float* den = ls + R * nblk;                    // [R]
  const float* part = (const float*)buf(c, pb);
  const bool pt = buf_tagged(c, pb);
  const long p0 = (long)h0 * nblk * G * W;
  for (int i = c.tid; i < R * nblk; i += NCT) {
    const int r = i / nblk, b = i % nblk;
    const long p = p0 + (((long)(r / G) * nblk + b) * G + r % G) * W;
    wt[i] = act_at(c, pb, part, pt, p);
    ls[i] = act_at(c, pb, part, pt, p + 1);
  }
  consumer_sync();
  for (int r = c.warp; r < R; r += NCW) {
    float mx = -INFINITY;
    for (int b = c.lane; b < nblk; b += 32) mx = fmaxf(mx, wt[r * nblk + b]);
    mx = warp_max(mx);
    __syncwarp();
    if (c.lane == 0) {
      float d = 0.f;
      for (int b = 0; b < nblk; ++b) {
        const float m = wt[r * nblk + b];
        const float w = m == -INFINITY ? 0.f : expf(m - mx);
        wt[r * nblk + b] = w;
        d = fmaf(ls[r * nblk + b], w, d);
      }
      den[r] = d;
    }
  }
  consumer_sync();
  if (tag) tag_release();
  for (int i = c.tid; i < R * hd; i += NCT) {
    const int r = i / hd, d = i % hd;
    const long p = p0 + ((long)(r / G) * nblk * G + r % G) * W + 2 + d;
    float acc = 0.f;
    for (int b = 0; b < nblk; ++b) {
      const float w = wt[r * nblk + b];
      if (w != 0.f) acc = fmaf(act_at(c, pb, part, pt, p + (long)b * G * W), w, acc);
    }
    const int o = (h0 * G + r) * hd + d;
    if (tag)
      st_tagged(dst, o, acc / den[r], tag);
    else
      dst[xs_index(o, R * hd, split)] = acc / den[r];
  }
  consumer_sync();
}
