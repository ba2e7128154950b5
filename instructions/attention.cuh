// What the attention opcodes share: merging the partials of KV heads (ATTN_COMBINE, and
// LINEAR_RESIDUAL combining on load). A partial is [m, l, acc[0:hd]] per query head of each block
// (instructions/attention.py).
#pragma once
#include "gemv.cuh"
#include "tagged.cuh"

// Blocks whose partial sums a combine thread loads before it settles any (combine_sums; the knob
// MVM_COMBINE_LOADS, default 4). Settled one at a time, tagged loads take an L2 round trip each, 16 in a row
// at llama-1b's ctx 32768; 4 at once shorten the combine's stage there by about 2 us a layer.
constexpr int COMBINE_LOADS = MVM_COMBINE_LOADS;

// combine_heads' block sums: thread t's output elements, each the sum over the blocks in block order,
// COMBINE_LOADS blocks' words loaded before the first is settled (ptag: the partials' tag, 0 when they are
// plain). Out of line: with 9 warps (168 registers) the main loop then spilled 48 / 84 bytes, against 60 / 108
// with the loop inlined and 316 to 540 with 4 or 8 loads a thread inlined (ptxas -v); with 12 warps, nothing.
__device__ __noinline__ void combine_sums(const mvm_args_t* a, const mvm_instr_t* ins, uint32_t block, uint32_t qpos,
                                          uint32_t ptag, int pb, const float* part, const float* wt, const float* den,
                                          int tid, int R, int G, int g0, int gn, int W, int nblk, long p0, int h0,
                                          float* dst, int split, uint32_t tag) {
  const int hd = W - 2;
  for (int i = tid; i < R * hd; i += NCT) {
    const int r = i / hd, d = i % hd, q = g0 + r % gn;     // row r: query head q of KV head h0 + r / gn
    const long p = p0 + ((long)(r / gn) * nblk * G + q) * W + 2 + d;
    float acc = 0.f;
    for (int b0 = 0; b0 < nblk; b0 += COMBINE_LOADS) {
      uint64_t v[COMBINE_LOADS];
#pragma unroll
      for (int k = 0; k < COMBINE_LOADS; ++k)
        if (b0 + k < nblk) v[k] = act_word(part, ptag != 0, p + (long)(b0 + k) * G * W);
#pragma unroll
      for (int k = 0; k < COMBINE_LOADS; ++k) {
        const int b = b0 + k;
        if (b >= nblk) break;
        const float w = wt[r * nblk + b];          // an empty block weighs 0: its word is not waited for
        if (w == 0.f) continue;
        const long at = p + (long)b * G * W;
        acc = fmaf(ptag ? settle(*a, block, qpos, ins, pb, part, at, ptag, v[k]) : __uint_as_float((uint32_t)v[k]), w,
                   acc);
      }
    }
    const int o = ((h0 + r / gn) * G + q) * hd + d;
    if (tag)
      st_tagged(dst, o, acc / den[r], tag);
    else
      dst[xs_index(o, R * hd, split)] = acc / den[r];
  }
}

// Merge the blocks of KV heads [h0, h1): dst[(h G + g) hd + d] for query heads g in [g0, g0 + gn) of each
// (the whole group: 0, G). Block weights first (one max and one exp per block and head, in shared memory at
// scratch: attention.py's combine_scratch floats), then every output element sums its blocks
// (combine_sums). Ends with a consumer_sync. With split, dst is the GEMV's activation vector of length
// (h1 - h0) G hd in its split layout (whole groups only); with tag (non-zero), dst is a tagged activation
// (instructions/tagged.cuh) that takes this step's tag. The partials are buffer pb, tagged or plain.
__device__ void combine_heads(mvm_ctx& c, int pb, int nblk, int G, int W, int h0, int h1, int g0, int gn, float* dst,
                              float* scratch, int split, uint32_t tag = 0) {
  const int R = (h1 - h0) * gn;                  // rows: (head, query head) pairs
  float* wt = scratch;                           // [R][nblk]: m, then exp(m - max)
  float* ls = wt + R * nblk;                     // [R][nblk]: l
  float* den = ls + R * nblk;                    // [R]
  const float* part = (const float*)buf(c, pb);
  const bool pt = buf_tagged(c, pb);
  const long p0 = (long)h0 * nblk * G * W;
  for (int i = c.tid; i < R * nblk; i += NCT) {
    const int r = i / nblk, b = i % nblk;
    const long p = p0 + (((long)(r / gn) * nblk + b) * G + g0 + r % gn) * W;
    const uint64_t m = act_word(part, pt, p), l = act_word(part, pt, p + 1);   // both loads in flight
    wt[i] = act_settle(c, pb, part, pt, p, m);
    ls[i] = act_settle(c, pb, part, pt, p + 1, l);
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
  combine_sums(&c.a, c.ins, c.block, c.qpos, pt ? step_tag(c) : 0u, pb, part, wt, den, c.tid, R, G, g0, gn, W, nblk,
               p0, h0, dst, split, tag);
  consumer_sync();
}
