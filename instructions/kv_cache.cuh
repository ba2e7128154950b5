// The KV cache [kv_heads, capacity, head_dim]: projection row R is element R % hd of KV head R / hd,
// written at position pos, at its swizzled place in the row (device.cuh: kv_swizzle;
// instructions/kv_cache.py).
#pragma once
#include "rotary.cuh"
#include "tagged.cuh"

// cache[R / hd, pos, R % hd] = acc[r] for the tile's rows R = row0 + r.
template <typename T>
__device__ void kv_store(mvm_ctx& c, T* cache, int row0, int nrows, int hd, long cap, int pos) {
  const int sw = kv_xor(pos, kv_swizzle<T>(hd)) << 3;
  for (int r = c.tid; r < nrows; r += NCT) {
    const int R = row0 + r;
    cache[((long)(R / hd) * cap + pos) * hd + ((R % hd) ^ sw)] = from_f<T>(c.s.acc[r]);
  }
}

// Rows [row0, row0 + nrows) of activation a (tagged or plain; rotated first with rope) appended at
// position pos; with rb >= 0 also stored, in f32, to that activation (the partials' own row).
template <typename T>
__device__ void append_rows(mvm_ctx& c, int ab, T* cache, int row0, int nrows, int hd, long cap, int pos,
                            bool rope, const float* freqs, int rb = -1) {
  const int sw = kv_xor(pos, kv_swizzle<T>(hd)) << 3;
  const float* a = (const float*)buf(c, ab);
  const bool at = buf_tagged(c, ab), rt = buf_tagged(c, rb);
  float* row = rb >= 0 ? (float*)buf(c, rb) : nullptr;
  if (rt) tag_release();
  for (int r = row0 + 2 * c.tid; r < row0 + nrows; r += 2 * NCT) {
    const bool two = r + 1 < row0 + nrows;
    const uint64_t w0 = act_word(a, at, r), w1 = two ? act_word(a, at, r + 1) : 0;   // both loads in flight
    float2 v = make_float2(act_settle(c, ab, a, at, r, w0), two ? act_settle(c, ab, a, at, r + 1, w1) : 0.f);
    if (rope) v = rope_pair(v.x, v.y, r, hd, pos, freqs);
    cache[((long)(r / hd) * cap + pos) * hd + ((r % hd) ^ sw)] = from_f<T>(v.x);
    if (two) cache[((long)((r + 1) / hd) * cap + pos) * hd + (((r + 1) % hd) ^ sw)] = from_f<T>(v.y);
    if (!row) continue;
    act_store(row, rt, r, v.x, step_tag(c));
    if (two) act_store(row, rt, r + 1, v.y, step_tag(c));
  }
}
