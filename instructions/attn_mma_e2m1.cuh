// The attention partial on tensor cores for NVFP4 K/V rows (e2m1 codes, an e4m3 scale per 16 elements,
// an f32 scale per row; instructions/kv_quant.py): the arithmetic of attn_mma_e4m3.cuh with other B
// operands. A code pair becomes an f16x2 of the codes times 2^-14 (e2m1x2_f16x2_raw) and is multiplied
// by its block scale times 2^7: the product, code x block scale x 2^-7, is exact in f16 (at most 6 of
// its bits are significant, and every product is a multiple of 2^-17). A key's f32 scale multiplies
// its scores after the product; a value row's is folded into its weight p, lifted by E2M1_VLIFT.
//
// Rows are 16-byte chunks of 32 codes, two blocks a chunk, not swizzled. Scores: ldmatrix gives a lane of
// chunk ch (8 keys) key g's bytes 4t .. 4t + 3, codes 8t .. 8t + 7 of the chunk, all in block 2 ch + t / 2;
// nibbles k and k + 4 make one B operand, so k-step 2 ch takes b0 = codes (8t, 8t + 4), b1 = (8t + 1,
// 8t + 5), k-step 2 ch + 1 b0 = (8t + 2, 8t + 6), b1 = (8t + 3, 8t + 7), and q's fragments take q's
// elements in that order. Values (.trans): a lane gets b16 unit g of keys 2t and 2t + 1, codes 4g .. 4g + 3
// of each (block 2 ch + g / 4); nibble k of each key's unit makes the B operand of element 4g + k, so
// n-tile 4 ch + k's output columns 2t, 2t + 1 are elements 32 ch + 8t + k and that + 4.
#pragma once
#include "attn_mma_e4m3.cuh"

constexpr float E2M1_VLIFT = 16.f;               // p x scale x 2^7 up to 16 (f16 holds it for |v| < 86000)

__device__ __forceinline__ void ldsm_x2(uint32_t addr, uint32_t (&r)[2]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];" : "=r"(r[0]), "=r"(r[1]) : "r"(addr));
}

// Two e4m3 block scales (bytes b0 of u0 and b1 of u1) times 2^7 as an f16x2 (exact); the first in the low half.
__device__ __forceinline__ __half2 bscale_pair(uint32_t u0, int b0, uint32_t u1, int b1) {
  const uint32_t two = __byte_perm(u0, u1, (uint32_t)b0 | (uint32_t)(4 + b1) << 4);
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(two & 0xffffu), __NV_E4M3);
  return __hmul2(__half2(h), __float2half2_rn(128.f));
}

// Key j's block scales (HD / 16 bytes) from L2 as words; zeros past the pass.
template <int HD> struct key_bscales {
  uint32_t w[HD / 64];
  __device__ __forceinline__ key_bscales(const uint8_t* bs, int j, int j1) {
    if constexpr (HD == 64) w[0] = j < j1 ? __ldcg(reinterpret_cast<const unsigned int*>(bs + (long)j * 4)) : 0u;
    else {
      const uint2 u = j < j1 ? __ldcg(reinterpret_cast<const uint2*>(bs + (long)j * 8)) : make_uint2(0u, 0u);
      w[0] = u.x; w[1] = u.y;
    }
  }
  __device__ __forceinline__ uint32_t word(int blk) const { return w[blk / 4]; }
};

// q's A operands per k-step of 16 elements (hi parts, times E4M3_LIFT), in the order the K fragments hold the codes.
template <int HD> struct q_frags_e2m1 {
  uint32_t a[HD / 16][2];                        // [k-step][a0, a2]
  __device__ __forceinline__ q_frags_e2m1(const float* qs, int lane, int G) {
    const int g = lane / 4, t = lane % 4;
#pragma unroll
    for (int ch = 0; ch < HD / 32; ++ch) {
      const float* p = qs + g * HD + ch * 32 + 8 * t;
      const float4 x = g < G ? *reinterpret_cast<const float4*>(p) : make_float4(0.f, 0.f, 0.f, 0.f);
      const float4 y = g < G ? *reinterpret_cast<const float4*>(p + 4) : make_float4(0.f, 0.f, 0.f, 0.f);
      const float L = E4M3_LIFT;
      const __half2 h0 = __floats2half2_rn(x.x * L, y.x * L), h1 = __floats2half2_rn(x.y * L, y.y * L);
      const __half2 h2 = __floats2half2_rn(x.z * L, y.z * L), h3 = __floats2half2_rn(x.w * L, y.w * L);
      a[2 * ch][0] = *reinterpret_cast<const uint32_t*>(&h0);
      a[2 * ch][1] = *reinterpret_cast<const uint32_t*>(&h1);
      a[2 * ch + 1][0] = *reinterpret_cast<const uint32_t*>(&h2);
      a[2 * ch + 1][1] = *reinterpret_cast<const uint32_t*>(&h3);
    }
  }
};

// Scores of keys [kr.j0, j1), as attn_scores_mma, each times its key's scale.
template <int HD>
__device__ __forceinline__ void attn_scores_mma(const attn_view& c, const q_frags_e2m1<HD>& q, float* sc, float& top,
                                                const kv_rows<mvm_e2m1kv>& kr, int j1, int n, int G, int KW) {
  constexpr int NC = HD / 32;                    // chunks a row
  const int g = c.lane / 4, t = c.lane % 4, mi = c.lane / 8, ri = c.lane % 8;
  const int u0 = kr.j0 / 8;
#pragma unroll 1
  for (int u = u0 + ((c.warp - u0) % KW + KW) % KW; u * 8 < j1; u += KW) {
    const int k0 = u * 8 + 2 * t;                // this lane's two keys: their scales from L2, before the products
    const float s0 = k0 < j1 ? __ldcg(kr.scale + k0) * (128.f / E4M3_LIFT) : 0.f;
    const float s1 = k0 + 1 < j1 ? __ldcg(kr.scale + k0 + 1) * (128.f / E4M3_LIFT) : 0.f;
    const key_bscales<HD> kb(kr.bscale, u * 8 + g, j1);     // key g of the tile: the B operands' column
    uint32_t r[NC];
    if constexpr (NC == 2) {
      uint32_t r2[2];
      ldsm_x2(mma_row(kr, u * 8 + ri, j1, HD / 2, mi % 2), r2);
      r[0] = r2[0]; r[1] = r2[1];
    } else {
      uint32_t r4[4];
      ldsm_x4(mma_row(kr, u * 8 + ri, j1, HD / 2, mi), r4);
#pragma unroll
      for (int m = 0; m < 4; ++m) r[m] = r4[m];
    }
    float d[4] = {};
#pragma unroll
    for (int ch = 0; ch < NC; ++ch) {
      const int blk = 2 * ch + t / 2;
      const __half2 m = bscale_pair(kb.word(blk), blk % 4, kb.word(blk), blk % 4);
      mma_rows8_f16(d, q.a[2 * ch][0], q.a[2 * ch][1], e2m1_pair(r[ch], 0, m), e2m1_pair(r[ch], 1, m));
      mma_rows8_f16(d, q.a[2 * ch + 1][0], q.a[2 * ch + 1][1], e2m1_pair(r[ch], 2, m), e2m1_pair(r[ch], 3, m));
    }
    if (g < G) {
      if (k0 < j1) {
        const float s = d[0] * s0;
        sc[g * n + k0] = s;
        top = fmaxf(top, s);
      }
      if (k0 + 1 < j1) {
        const float s = d[1] * s1;
        sc[g * n + k0 + 1] = s;
        top = fmaxf(top, s);
      }
    }
  }
}

// Value sums of keys [vr.j0, j1), as attn_values_mma: weights p times the value rows' scales x 2^7 x
// E2M1_VLIFT, acc[nt] in the n-tile order above.
template <int HD>
__device__ __forceinline__ void attn_values_mma(const attn_view& c, const float* sc, float m, float (&acc)[HD / 8][4],
                                                float& w, const kv_rows<mvm_e2m1kv>& vr, int j1, int n, int G, int KW) {
  constexpr int NC = HD / 32;
  const int g = c.lane / 4, t = c.lane % 4, mi = c.lane / 8, ri = c.lane % 8;
  const int u0 = vr.j0 / 16;
  for (int u = u0 + ((c.warp - u0) % KW + KW) % KW; u * 16 < j1; u += KW) {
    const int k0 = u * 16;
    float p[4], vs[4];                           // keys k0 + 2t, + 1, k0 + 8 + 2t, + 1; their scales (L2) first
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int j = k0 + (e / 2) * 8 + 2 * t + (e & 1);
      vs[e] = j < j1 ? __ldcg(vr.scale + j) * (128.f * E2M1_VLIFT) : 0.f;
    }
    // the four keys' block scales (zeros past the pass: their rows may be stale ring bytes)
    const key_bscales<HD> b0(vr.bscale, k0 + 2 * t, j1), b1(vr.bscale, k0 + 2 * t + 1, j1);
    const key_bscales<HD> b8(vr.bscale, k0 + 8 + 2 * t, j1), b9(vr.bscale, k0 + 9 + 2 * t, j1);
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int j = k0 + (e / 2) * 8 + 2 * t + (e & 1);
      const float pe = g < G && j < j1 ? expf(sc[g * n + j] - m) : 0.f;
      w += pe;
      p[e] = pe * vs[e];
    }
    const __half2 a0h = __floats2half2_rn(p[0], p[1]), a2h = __floats2half2_rn(p[2], p[3]);
    const uint32_t a0 = *reinterpret_cast<const uint32_t*>(&a0h), a2 = *reinterpret_cast<const uint32_t*>(&a2h);
    uint32_t lo[NC], hi[NC];                     // chunk ch of keys k0 .. k0 + 7 (lo) and k0 + 8 .. (hi)
    if constexpr (NC == 2) {
      uint32_t r4[4];                            // matrix mi: chunk mi % 2 of keys k0 + 8 (mi / 2) ..
      ldsm_x4_trans(mma_row(vr, k0 + 8 * (mi / 2) + ri, j1, HD / 2, mi % 2), r4);
      lo[0] = r4[0]; lo[1] = r4[1]; hi[0] = r4[2]; hi[1] = r4[3];
    } else {
      uint32_t r0[4], r1[4];
      ldsm_x4_trans(mma_row(vr, k0 + ri, j1, HD / 2, mi), r0);
      ldsm_x4_trans(mma_row(vr, k0 + 8 + ri, j1, HD / 2, mi), r1);
#pragma unroll
      for (int ch = 0; ch < 4; ++ch) { lo[ch] = r0[ch]; hi[ch] = r1[ch]; }
    }
#pragma unroll
    for (int ch = 0; ch < NC; ++ch) {
      const int blk = 2 * ch + g / 4;
      const __half2 mlo = bscale_pair(b0.word(blk), blk % 4, b1.word(blk), blk % 4);
      const __half2 mhi = bscale_pair(b8.word(blk), blk % 4, b9.word(blk), blk % 4);
#pragma unroll
      for (int k = 0; k < 4; ++k)
        mma_rows8_f16(acc[4 * ch + k], a0, a2, e2m1_pair(lo[ch], k, mlo), e2m1_pair(hi[ch], k, mhi));
    }
  }
}
