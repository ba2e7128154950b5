// ROPE: rows of a vector another task wrote, with their bias and head norm where present, rotated at
// position pos (the unfused form of RMS_LINEAR_ROPE's epilogue; the finisher of short q tiles).
#pragma once
#include "qkv.cuh"
#include "rotary.cuh"

__device__ bool op_rope(mvm_ctx& c) {
  using Op = ROPE;
  const int row0 = Op::row0(c.ins), nrows = Op::nrows(c.ins), hd = Op::head_dim(c.ins);
  const int ab = Op::a(c.ins);
  const float* freqs = (const float*)buf(c, Op::freqs(c.ins));
  const int pos = input_pos(c);
  if (Op::bias(c.ins) >= 0 || Op::head_norm(c.ins) >= 0) {   // finished in shared memory, as the tiles do
    finish_rows(c, ab, row0, nrows, hd, Op::eps(c.ins), Op::bias(c.ins) >= 0, Op::head_norm(c.ins) >= 0, true, pos);
    store_rows(c, Op::y(c.ins), row0, nrows);
    return true;
  }
  const float* a = (const float*)buf(c, ab);
  const bool at = buf_tagged(c, ab), yt = buf_tagged(c, Op::y(c.ins));
  float* y = (float*)buf(c, Op::y(c.ins));
  if (yt) tag_release();
  for (int r = row0 + 2 * c.tid; r < row0 + nrows; r += 2 * NCT) {
    const uint64_t w0 = act_word(a, at, r), w1 = act_word(a, at, r + 1);     // both loads in flight
    const float2 v = rope_pair(act_settle(c, ab, a, at, r, w0), act_settle(c, ab, a, at, r + 1, w1), r, hd, pos, freqs);
    act_store(y, yt, r, v.x, step_tag(c));
    act_store(y, yt, r + 1, v.y, step_tag(c));
  }
  return true;
}
