// The scales of a quantized KV cache, staged in shared memory for the tensor-core attention partial
// (attn_partial.cuh) a pass of ring stages at a time.
#pragma once
#include "attn_mma_e2m1.cuh"

// A quantized cache's scales on the tensor-core path, staged in shared memory a pass at a time (two buffers
// after the own rows; attention.py: staged_scales): a buffer holds the row scales of a ring stage's keys and
// of the own row, then an e2m1 cache's block scales as words, key by key. The consumer threads load pass i
// (K passes 0 .. P - 1, then the V passes) from L2 into registers while pass i - 1 is computed, store it
// into buffer i % 2 once every warp is done with pass i - 2's, and meet at a barrier before reading it, so
// the key tiles wait on shared memory, not on L2 (each waited on an L2 load of its scales before).
template <typename T, int HD> struct pass_scales {
  static constexpr bool E2M1 = std::is_same<T, mvm_e2m1kv>::value;
  static constexpr int BW = E2M1 ? HD / 64 : 0;                      // block-scale words a key
  static constexpr int SK = STAGE_BYTES / (E2M1 ? HD / 2 : HD) + 4;  // keys a buffer: a stage's, the own row
  static constexpr int WORDS = SK * (1 + BW);                        // words a buffer
  static constexpr int NW = (WORDS + NCT - 1) / NCT;                 // words a thread moves
  static_assert(STAGE_BYTES <= 16384, "attention.py: staged_scales sizes the buffers for stages of 16 KiB");
  // row scales as the tensor-core loops take them (powers of two, exact): e4m3 keys / E4M3_LIFT, values x
  // E4M3_LIFT (attn_mma_e4m3.cuh); e2m1 E2M1_KSCALE, E2M1_VSCALE (attn_mma_e2m1.cuh)
  static constexpr float KMUL = E2M1 ? E2M1_KSCALE : 1.f / E4M3_LIFT;
  static constexpr float VMUL = E2M1 ? E2M1_VSCALE : E4M3_LIFT;
  const float *ks, *vs;                          // scales of key 0 of the block (K, V)
  const uint8_t *kb, *vb;                        // e2m1: block scales of key 0
  int P, R, n, tid;                              // passes of K (and of V), keys a pass, keys in all
  uint32_t base;                                 // buffer 0's shared address
  uint32_t r[NW], r2[NW];                        // pass i + 1's words; r2: the V pass's of a single-pass block
  __device__ __forceinline__ uint32_t buffer(int i) const { return base + 4 * WORDS * (i & 1); }
  __device__ __forceinline__ void fetch(int i, uint32_t (&to)[NW]) const {
    const int k = i % P, j0 = k * R, j1 = k + 1 < P ? j0 + R : n;
    const float* sc = i < P ? ks : vs;
    const uint8_t* bs = i < P ? kb : vb;
#pragma unroll
    for (int e = 0; e < NW; ++e) {
      const int w = tid + e * NCT;
      uint32_t x = 0u;
      if (w < SK) {
        if (j0 + w < j1) x = __float_as_uint(__ldcg(sc + j0 + w));   // multiplied when stored: no wait here
      } else if (BW > 0 && w < WORDS) {
        const int j = j0 + (w - SK) / max(BW, 1);
        if (j < j1) x = __ldcg(reinterpret_cast<const unsigned int*>(bs + (long)j * (HD / 16)) + (w - SK) % max(BW, 1));
      }
      to[e] = x;
    }
  }
  __device__ __forceinline__ void put(int i, const uint32_t (&from)[NW]) const {
    const float mul = i < P ? KMUL : VMUL;
#pragma unroll
    for (int e = 0; e < NW; ++e) {
      const int w = tid + e * NCT;
      if (w < WORDS) sts32(buffer(i) + 4 * w, w < SK ? __float_as_uint(__uint_as_float(from[e]) * mul) : from[e]);
    }
  }
  // Before the partial's q: the first pass's scales on their way (and a single-pass block's V pass's).
  __device__ __forceinline__ void begin() {
    fetch(0, r);
    if (P == 1) fetch(1, r2);
  }
  // Before the barrier that opens the K passes: the first pass's scales stored (a single-pass block's V
  // pass's too: it then needs no barrier of its own), the second's on their way.
  __device__ __forceinline__ void ready() {
    put(0, r);
    if (P == 1) put(1, r2);
    else fetch(1, r);
  }
  // After pass i: pass i + 1's scales into their buffer (pass i - 1's, which every warp is done with), pass
  // i + 2's loads issued, and the barrier that makes pass i + 1's visible and frees pass i's buffer.
  __device__ __forceinline__ void advance(int i) {
    if (P == 1 || i + 1 >= 2 * P) return;
    put(i + 1, r);
    if (i + 2 < 2 * P) fetch(i + 2, r);
    consumer_sync();
  }
};
