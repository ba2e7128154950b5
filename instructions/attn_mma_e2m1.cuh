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
// A row's scale as the loops take it: a key's times 2^7 / E4M3_LIFT (q is lifted, block scales carry 2^7), a
// value's times 2^7 x E2M1_VLIFT (folded into p). Powers of two: exact.
constexpr float E2M1_KSCALE = 128.f / E4M3_LIFT, E2M1_VSCALE = 128.f * E2M1_VLIFT;

__device__ __forceinline__ void ldsm_x2(uint32_t addr, uint32_t (&r)[2]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];" : "=r"(r[0]), "=r"(r[1]) : "r"(addr));
}

// Two e4m3 block scales (bytes b0 of u0 and b1 of u1) times 2^7 as an f16x2 (exact); the first in the low half.
__device__ __forceinline__ __half2 bscale_pair(uint32_t u0, int b0, uint32_t u1, int b1) {
  const uint32_t two = __byte_perm(u0, u1, (uint32_t)b0 | (uint32_t)(4 + b1) << 4);
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(two & 0xffffu), __NV_E4M3);
  return __hmul2(__half2(h), __float2half2_rn(128.f));
}

// Whether a pass's scales come staged in shared memory (attn_scales.cuh: pass_scales): at head_dim 64. At
// 128 the loops read them from L2, as before the staging: staged, that instance took more registers (with
// both instances in one build, the main loop's stack went from 704 to 800 bytes, ptxas -v).
template <int HD> constexpr bool E2M1_STAGED = HD == 64;

// Key j's row scale as the loops take it (mul: E2M1_KSCALE or E2M1_VSCALE).
template <int HD>
__device__ __forceinline__ float e2m1_scale(const kv_rows<mvm_e2m1kv>& kr, int j, float mul) {
  if constexpr (E2M1_STAGED<HD>) return kr.staged_scale(j);                  // multiplied when staged
  else return __ldcg(kr.scale + j) * mul;
}

// Key j's block scales (HD / 16 bytes) as words, staged or from L2; zeros past the pass.
template <int HD> struct key_bscales {
  uint32_t w[HD / 64];
  key_bscales() = default;
  __device__ __forceinline__ key_bscales(const kv_rows<mvm_e2m1kv>& kr, int j, int j1) {
#pragma unroll
    for (int i = 0; i < HD / 64; ++i)
      w[i] = j >= j1 ? 0u : E2M1_STAGED<HD> ? kr.staged_bword(j, i, HD / 64)
                          : __ldcg(reinterpret_cast<const unsigned int*>(kr.bscale + (long)j * (HD / 16)) + i);
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

// One tile's score products: 8 keys' code words r (chunk ch of key g's row), key g's block-scale words.
template <int HD>
__device__ __forceinline__ void scores_tile(float (&d)[4], const q_frags_e2m1<HD>& q, const uint32_t (&r)[HD / 32],
                                            const key_bscales<HD>& kb, int t) {
#pragma unroll
  for (int ch = 0; ch < HD / 32; ++ch) {
    const int blk = 2 * ch + t / 2;
    const __half2 m = bscale_pair(kb.word(blk), blk % 4, kb.word(blk), blk % 4);
    mma_rows8_f16(d, q.a[2 * ch][0], q.a[2 * ch][1], e2m1_pair(r[ch], 0, m), e2m1_pair(r[ch], 1, m));
    mma_rows8_f16(d, q.a[2 * ch + 1][0], q.a[2 * ch + 1][1], e2m1_pair(r[ch], 2, m), e2m1_pair(r[ch], 3, m));
  }
}

// ldmatrix's codes of 8 keys from the row address this lane names (chunk mi, or mi % 2 of rows of 2 chunks).
template <int HD> __device__ __forceinline__ void key_codes(uint32_t addr, uint32_t (&r)[HD / 32]) {
  if constexpr (HD == 64) ldsm_x2(addr, r);
  else ldsm_x4(addr, r);
}

// Scores of keys [kr.j0, j1), as attn_scores_mma, each times its key's scale. Whole tiles of history
// keys (before the own row, inside the pass) first, with addresses stepped and no bounds checked; then
// the rest, each key checked.
template <int HD>
__device__ __forceinline__ void attn_scores_mma(const attn_view& c, const q_frags_e2m1<HD>& q, float* sc, float& top,
                                                const kv_rows<mvm_e2m1kv>& kr, int j1, int n, int G, int KW) {
  constexpr int NC = HD / 32, RB = HD / 2, BW = HD / 64;   // chunks a row, bytes a row, block-scale words a key
  const int g = c.lane / 4, t = c.lane % 4, mi = c.lane / 8, ri = c.lane % 8;
  const int u0 = kr.j0 / 8;
  int u = u0 + ((c.warp - u0) % KW + KW) % KW;
  const int jh = MVM_ATTN_WHOLE_TILES ? min(j1, kr.jo) : kr.j0;  // whole tiles end here (0: none)
  if (E2M1_STAGED<HD> && u * 8 + 8 <= jh) {
    const int at = u * 8 - kr.j0;                // the first tile's key, from the pass's first
    uint32_t row = smem_addr(kr.rows) + (at + ri) * RB + 16 * (NC == 2 ? mi % 2 : mi);
    uint32_t sa = kr.ss + 4 * (at + 2 * t), ba = kr.ss + 4 * (kr.sk + (at + g) * BW);
    float* out = sc + min(g, G - 1) * n + u * 8 + 2 * t;
#pragma unroll 1
    for (; u * 8 + 8 <= jh; u += KW, row += KW * 8 * RB, sa += KW * 32, ba += KW * 32 * BW, out += KW * 8) {
      const float s0 = __uint_as_float(lds32(sa)), s1 = __uint_as_float(lds32(sa + 4));
      key_bscales<HD> kb;
#pragma unroll
      for (int i = 0; i < BW; ++i) kb.w[i] = lds32(ba + 4 * i);
      uint32_t r[NC];
      key_codes<HD>(row, r);
      float d[4] = {};
      scores_tile<HD>(d, q, r, kb, t);
      if (g < G) {
        out[0] = d[0] * s0;
        out[1] = d[1] * s1;
        top = fmaxf(top, fmaxf(d[0] * s0, d[1] * s1));
      }
    }
  }
#pragma unroll 1
  for (; u * 8 < j1; u += KW) {
    const int k0 = u * 8 + 2 * t;                // this lane's two keys: their scales (staged, or from L2)
    const float s0 = k0 < j1 ? e2m1_scale<HD>(kr, k0, E2M1_KSCALE) : 0.f;
    const float s1 = k0 + 1 < j1 ? e2m1_scale<HD>(kr, k0 + 1, E2M1_KSCALE) : 0.f;
    const key_bscales<HD> kb(kr, u * 8 + g, j1);  // key g of the tile: the B operands' column
    uint32_t r[NC];
    key_codes<HD>(mma_row(kr, u * 8 + ri, j1, HD / 2, NC == 2 ? mi % 2 : mi), r);
    float d[4] = {};
    scores_tile<HD>(d, q, r, kb, t);
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

// One tile's value products: weights a0 (keys 2t, 2t + 1) and a2 (8 + 2t, 9 + 2t) of 16 keys, their code
// words lo (keys 0 .. 7) and hi (8 .. 15), and the block scales of this lane's keys 2t, 2t + 1 (b0, b1) and
// 8 + 2t, 9 + 2t (b8, b9).
template <int HD>
__device__ __forceinline__ void values_tile(float (&acc)[HD / 8][4], uint32_t a0, uint32_t a2,
                                            const uint32_t (&lo)[HD / 32], const uint32_t (&hi)[HD / 32],
                                            const key_bscales<HD>& b0, const key_bscales<HD>& b1,
                                            const key_bscales<HD>& b8, const key_bscales<HD>& b9, int g) {
#pragma unroll
  for (int ch = 0; ch < HD / 32; ++ch) {
    const int blk = 2 * ch + g / 4;
    const __half2 mlo = bscale_pair(b0.word(blk), blk % 4, b1.word(blk), blk % 4);
    const __half2 mhi = bscale_pair(b8.word(blk), blk % 4, b9.word(blk), blk % 4);
#pragma unroll
    for (int k = 0; k < 4; ++k)
      mma_rows8_f16(acc[4 * ch + k], a0, a2, e2m1_pair(lo[ch], k, mlo), e2m1_pair(hi[ch], k, mhi));
  }
}

// ldmatrix (.trans) of 16 keys' codes: lo of keys 0 .. 7, hi of 8 .. 15, from the rows this lane names.
template <int HD>
__device__ __forceinline__ void value_codes(uint32_t addr0, uint32_t addr8, uint32_t (&lo)[HD / 32],
                                            uint32_t (&hi)[HD / 32]) {
  if constexpr (HD == 64) {
    uint32_t r4[4];                              // matrix mi: chunk mi % 2 of keys 8 (mi / 2) ..
    ldsm_x4_trans(addr0, r4);
    lo[0] = r4[0]; lo[1] = r4[1]; hi[0] = r4[2]; hi[1] = r4[3];
  } else {
    ldsm_x4_trans(addr0, lo);
    ldsm_x4_trans(addr8, hi);
  }
}

// Value sums of keys [vr.j0, j1), as attn_values_mma: weights p times the value rows' scales x 2^7 x
// E2M1_VLIFT, acc[nt] in the n-tile order above. Whole tiles of history keys first, as the scores.
template <int HD>
__device__ __forceinline__ void attn_values_mma(const attn_view& c, const float* sc, float m, float (&acc)[HD / 8][4],
                                                float& w, const kv_rows<mvm_e2m1kv>& vr, int j1, int n, int G, int KW) {
  constexpr int NC = HD / 32, RB = HD / 2, BW = HD / 64;
  const int g = c.lane / 4, t = c.lane % 4, mi = c.lane / 8, ri = c.lane % 8;
  const int u0 = vr.j0 / 16;
  int u = u0 + ((c.warp - u0) % KW + KW) % KW;
  const int jh = MVM_ATTN_WHOLE_TILES ? min(j1, vr.jo) : vr.j0;  // whole tiles end here (0: none)
  const float on = g < G ? 1.f : 0.f;          // lanes past the group weigh nothing
  const float mL = m * 1.4426950408889634f;
  if (E2M1_STAGED<HD> && u * 16 + 16 <= jh) {
    const int at = u * 16 - vr.j0;
    // matrix mi's rows: HD 64, chunk mi % 2 of keys 8 (mi / 2) + ri; HD 128, chunk mi of keys ri (and 8 + ri)
    uint32_t row = smem_addr(vr.rows) + (at + (NC == 2 ? 8 * (mi / 2) : 0) + ri) * RB + 16 * (NC == 2 ? mi % 2 : mi);
    uint32_t sa = vr.ss + 4 * (at + 2 * t), ba = vr.ss + 4 * (vr.sk + (at + 2 * t) * BW);
    const float* in = sc + min(g, G - 1) * n + u * 16 + 2 * t;
#pragma unroll 1
    for (; u * 16 + 16 <= jh; u += KW, row += KW * 16 * RB, sa += KW * 64, ba += KW * 64 * BW, in += KW * 16) {
      float p[4];
      tile_weights(in, mL, on, p, w);
      const __half2 a0h = __floats2half2_rn(p[0] * __uint_as_float(lds32(sa)), p[1] * __uint_as_float(lds32(sa + 4)));
      const __half2 a2h = __floats2half2_rn(p[2] * __uint_as_float(lds32(sa + 32)),
                                            p[3] * __uint_as_float(lds32(sa + 36)));
      key_bscales<HD> b0, b1, b8, b9;
#pragma unroll
      for (int i = 0; i < BW; ++i) {
        b0.w[i] = lds32(ba + 4 * i);
        b1.w[i] = lds32(ba + 4 * (BW + i));
        b8.w[i] = lds32(ba + 4 * (8 * BW + i));
        b9.w[i] = lds32(ba + 4 * (9 * BW + i));
      }
      uint32_t lo[NC], hi[NC];
      value_codes<HD>(row, row + 8 * RB, lo, hi);
      values_tile<HD>(acc, *reinterpret_cast<const uint32_t*>(&a0h), *reinterpret_cast<const uint32_t*>(&a2h), lo, hi,
                      b0, b1, b8, b9, g);
    }
  }
#pragma unroll 1
  for (; u * 16 < j1; u += KW) {
    const int k0 = u * 16;
    float p[4], vs[4];                           // keys k0 + 2t, + 1, k0 + 8 + 2t, + 1; their scales (staged or L2)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int j = k0 + (e / 2) * 8 + 2 * t + (e & 1);
      vs[e] = j < j1 ? e2m1_scale<HD>(vr, j, E2M1_VSCALE) : 0.f;
    }
    // the four keys' block scales (zeros past the pass: their rows may be stale ring bytes)
    const key_bscales<HD> b0(vr, k0 + 2 * t, j1), b1(vr, k0 + 2 * t + 1, j1);
    const key_bscales<HD> b8(vr, k0 + 8 + 2 * t, j1), b9(vr, k0 + 9 + 2 * t, j1);
    checked_weights(sc, n, g, G, k0, t, j1, mL, p, w);
#pragma unroll
    for (int e = 0; e < 4; ++e) p[e] *= vs[e];
    const __half2 a0h = __floats2half2_rn(p[0], p[1]), a2h = __floats2half2_rn(p[2], p[3]);
    uint32_t lo[NC], hi[NC];
    value_codes<HD>(mma_row(vr, k0 + (NC == 2 ? 8 * (mi / 2) : 0) + ri, j1, HD / 2, NC == 2 ? mi % 2 : mi),
                    mma_row(vr, k0 + 8 + ri, j1, HD / 2, mi), lo, hi);
    values_tile<HD>(acc, *reinterpret_cast<const uint32_t*>(&a0h), *reinterpret_cast<const uint32_t*>(&a2h), lo, hi,
                    b0, b1, b8, b9, g);
  }
}
