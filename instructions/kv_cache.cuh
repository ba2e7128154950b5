// The KV cache [kv_heads, capacity, head_dim]: projection row R is element R % hd of KV head R / hd,
// written at position pos, at its swizzled place in the row (device.cuh: kv_swizzle;
// instructions/kv_cache.py).
#pragma once
#include "rotary.cuh"

// cache[R / hd, pos, R % hd] = acc[r] for the tile's rows R = row0 + r.
template <typename T>
__device__ void kv_store(mvm_ctx& c, T* cache, int row0, int nrows, int hd, long cap, int pos) {
  const int sw = kv_xor(pos, kv_swizzle<T>(hd)) << 3;
  for (int r = c.tid; r < nrows; r += NCT) {
    const int R = row0 + r;
    cache[((long)(R / hd) * cap + pos) * hd + ((R % hd) ^ sw)] = from_f<T>(c.s.acc[r]);
  }
}

// Rows [row0, row0 + nrows) of vector a (rotated first with rope) appended at position pos.
template <typename T>
__device__ void append_rows(mvm_ctx& c, const float* a, T* cache, int row0, int nrows, int hd, long cap, int pos,
                            bool rope, const float* freqs) {
  const int sw = kv_xor(pos, kv_swizzle<T>(hd)) << 3;
  for (int r = row0 + 2 * c.tid; r < row0 + nrows; r += 2 * NCT) {
    float2 v = make_float2(__ldcg(a + r), r + 1 < row0 + nrows ? __ldcg(a + r + 1) : 0.f);
    if (rope) v = rope_pair(v.x, v.y, r, hd, pos, freqs);
    cache[((long)(r / hd) * cap + pos) * hd + ((r % hd) ^ sw)] = from_f<T>(v.x);
    if (r + 1 < row0 + nrows)
      cache[((long)((r + 1) / hd) * cap + pos) * hd + (((r + 1) % hd) ^ sw)] = from_f<T>(v.y);
  }
}
