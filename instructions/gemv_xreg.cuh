// The held-activation GEMV (MVM_XREG): packed 4-bit rows (NVFP4, mxfp4, int4) of K = 2048, and of
// K = 4096 for the formats MVM_XREG_WIDE names, with each lane's activations in registers for the tile.
// gemv_packed (gemv.cuh) calls it where xreg_takes says so, in place of gemv_core's row-per-warp loop.
#pragma once
#include "gemv_core.cuh"

// A row is g = K / 2048 segments of 64 pieces (2048 codes, 1 KiB), so a 16 KiB ring stage holds 16 whole
// segments and no segment straddles two. Warp w takes segments w, w + NCW, ... of every stage: segment s
// is part s % g = w % g of row s / g, and lane l meets its pieces l and l + 32. So a lane's 64
// activations are the same for every segment it takes: it loads them from xs once a tile and holds them
// in registers, and each piece costs one shared-memory load of codes (the row-per-warp loop: eight of
// activations as well). One segment a trip, the next one's scale words loaded before this one's codes.
// g = 1 sums a row in gemv_core's order (the same bits); g = 2 adds the two parts' sums, kept at the top
// of xs, in part order. rsc (NVFP4): the tile's f32 row scales, each row's sum times 2^14 and its scale
// here (gemv_packed's product, the same bits), so that the call is gemv_packed's last (a call with
// values live across it made the main kernel spill). Rows of K = 8192 (g = 4) were slower on every
// format, K = 4096 on NVFP4 (docs/quantization.md, "Activations held in registers").
constexpr int XREG_SEGS = STAGE_BYTES / 1024;    // 1 KiB segments a ring stage
template <typename T>
__device__ __forceinline__ constexpr int xreg_bit() {
  return std::is_same<T, mvm_u4x2>::value ? 1 : std::is_same<T, mvm_e2m1x2>::value ? 2
         : std::is_same<T, mvm_mx4x2>::value ? 4 : 0;
}
// Whether gemv_xreg takes a tile: by K alone on a build sized to its program (gemv_shared holds K + NCW
// nrows floats of xs, and g = 2's part sums, 2 nrows, sit above x).
template <typename T>
__device__ __forceinline__ bool xreg_takes(const gemv_view& v, int nrows, int K) {
  if constexpr ((MVM_XREG & xreg_bit<T>()) == 0 || XREG_SEGS % NCW != 0 || NCW % 2 != 0) return false;
  else return K == 2048 || ((MVM_XREG_WIDE & xreg_bit<T>()) != 0 && K == 4096 &&
                            v.xs + K <= v.part + PART_FLOATS - 2 * nrows);
}
template <typename T>
__device__ __noinline__ int2 gemv_xreg(gemv_view v, const T* gsrc, int nrows, int K, float* acc,
                                       const unsigned char* bs, const float* rsc = nullptr) {
  constexpr bool E2M1 = std::is_same<T, mvm_e2m1x2>::value;
  constexpr int SPW = XREG_SEGS / NCW;           // segments a warp takes in a stage
  const int g = K >> 11, lg = g - 1, h = v.warp & lg;   // g: 1 or 2
  const int qa = 64 * h + v.lane, qb = qa + 32;  // this lane's pieces, counted in the row
  const uint32_t xs0 = smem_addr(v.xs), hb = (uint32_t)K / 2;   // xs_split 3: eight runs of K/8 floats
  float4 xa[8], xb[8];
  load_runs8(xa, xs0 + 16u * qa, hb);
  load_runs8(xb, xs0 + 16u * qb, hb);
  const long rowb = E2M1 ? K / 16 : K / 32;      // scale bytes a row
  auto words = [&](int s, uint32_t& wa, uint32_t& wb, float& rs) {   // segment s's scale words, row scale
    if (g == 1 && rsc != nullptr) rs = __ldg(rsc + s);
    const unsigned char* sr = bs + (s >> lg) * rowb;
    wa = scale_word<T>(sr, qa);
    wb = scale_word<T>(sr, qb);
  };
  const int nseg = nrows * g, nst = (nseg + XREG_SEGS - 1) / XREG_SEGS;
  const uint4* gw = reinterpret_cast<const uint4*>(gsrc);
  const uint32_t ring0 = smem_addr(v.ring) + 1024u * v.warp + 16u * v.lane;
  float* const parts = v.part + (PART_FLOATS - g * nrows);
  const int t = v.warp * 32 + v.lane;            // g = 2: thread t adds row t's parts; its row scale now
  const float rs0 = g > 1 && rsc != nullptr && t < nrows ? __ldg(rsc + t) : 0.f;
  uint32_t ca = 0, cb = 0, na = 0, nb = 0;       // this segment's scale words, the next one's
  float cr = 1.f, nr = 1.f;
  if (v.warp < nseg) words(v.warp, ca, cb, cr);
  uint32_t a0 = 0;
  for (int k = 0; k < nst * SPW; ++k) {
    const int i = k % SPW, st = k / SPW;
    const int s = st * XREG_SEGS + v.warp + i * NCW;
    const int sn = i + 1 < SPW ? s + NCW : s + XREG_SEGS - (SPW - 1) * NCW;   // the next one
    if (sn < nseg) words(sn, na, nb, nr);
    if (i == 0 && !v.direct) {
      while (!mbar_try_wait(v.full0 + 8 * v.stage, v.phase)) {}
      a0 = ring0 + (uint32_t)v.stage * STAGE_BYTES;
    }
    if (s < nseg) {
      const uint4 wa = v.direct ? __ldcs(gw + 64 * s + v.lane) : lds128(a0 + 1024u * NCW * i);
      const uint4 wb = v.direct ? __ldcs(gw + 64 * s + v.lane + 32) : lds128(a0 + 1024u * NCW * i + 512u);
      float d = dot_codes32<T>(wa, xa, ca) + dot_codes32<T>(wb, xb, cb);
      if (i == SPW - 1 && !v.direct) release_stage(v);
      d = warp_sum(d);
      if (v.lane == 0) {
        if (g > 1) parts[h * nrows + (s >> lg)] = d;
        else acc[s] = rsc != nullptr ? d * (16384.f * cr) : d;
      }
    } else if (i == SPW - 1 && !v.direct) {
      release_stage(v);
    }
    ca = na; cb = nb; cr = nr;
  }
  if (g > 1) {
    consumer_sync();
    for (int r = t; r < nrows; r += NCT) {
      const float a = parts[r] + parts[nrows + r];
      acc[r] = rsc != nullptr ? a * (16384.f * (r == t ? rs0 : __ldg(rsc + r))) : a;
    }
  }
  consumer_sync();
  return make_int2(v.stage, (int)v.phase);
}
