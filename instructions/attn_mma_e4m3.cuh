// The attention partial on tensor cores for e4m3 K/V rows (a quantized cache, instructions/kv_quant.py):
// the arithmetic of attn_mma.cuh with f16 operands. Codes become f16 exactly (the hardware's e4m3x2 ->
// f16x2 conversion); q and p are split into f16 hi + lo, each first times E4M3_LIFT = 2^8 (exact), so that
// the lo parts of small q and of p x scale stay normal f16 (a value row's scale, about amax / 448, is
// folded into its weight p; the weights' sum w stays unscaled), and the sums are divided by it again. A
// key's scale multiplies its scores after the product. A pass's scales come staged in shared memory
// (attn_scales.cuh: pass_scales).
//
// ldmatrix reads b16 units, two codes each. Scores: a lane of K matrix m (16 codes of 8 keys) gets key
// g's codes 4t .. 4t + 3, so k-step m's B operands are b0 = codes 4t, 4t+1 and b1 = 4t+2, 4t+3, and the
// q fragments take q's elements in that order (a0 = 4t, 4t+1, a2 = 4t+2, 4t+3: the sum over a k-step
// does not care). Values (.trans): a lane gets keys 2t and 2t+1 of codes 2g and 2g+1; one byte
// permutation splits them into the B operand of element 2g (n-tile 2 m) and of 2g + 1 (n-tile 2 m + 1),
// so n-tile nt's output columns 2t, 2t + 1 are elements 16 (nt / 2) + 4t + nt % 2 and that + 2.
#pragma once
#include "attn_mma.cuh"

constexpr float E4M3_LIFT = 256.f;               // q and p x scale up to 256 (f16 holds 65504 / 448 x 256)
// Whether the lo parts are multiplied too. Not by default: codes carry 4 significant bits, so q and p
// in f16 (11) lose nothing the cache kept, and the products halve (with them: ctx 32768 1.659 ms).
constexpr bool E4M3_LO = MVM_E4M3_ATTN_LO != 0;

__device__ __forceinline__ void mma_rows8_f16(float (&d)[4], uint32_t a0, uint32_t a2, uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(0u), "r"(a2), "r"(0u), "r"(b0), "r"(b1));
}

// Two e4m3 codes (the low 16 bits, the first in the low byte) as an f16x2, exactly.
__device__ __forceinline__ uint32_t e4m3x2_f16x2(uint32_t u) {
  if (MVM_PROBE_E4M3_CVT) return __byte_perm(u, 0, 0x4140) << 2;   // a probe: one cheap move, wrong values
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(u & 0xffffu), __NV_E4M3);
  return (uint32_t)h.x | ((uint32_t)h.y << 16);
}

// Two floats as f16 pairs hi + lo; the first float in the low half.
struct f16x2_split {
  uint32_t hi, lo;
  __device__ __forceinline__ f16x2_split(float x0, float x1) {
    const __half2 h = __floats2half2_rn(x0, x1);
    const float2 hf = __half22float2(h);
    const __half2 l = __floats2half2_rn(x0 - hf.x, x1 - hf.y);
    hi = *reinterpret_cast<const uint32_t*>(&h);
    lo = *reinterpret_cast<const uint32_t*>(&l);
  }
};

// q's A operands per k-step of 16 elements, hi and lo, in the order the K fragments hold the codes.
template <int HD> struct q_frags_e4m3 {
  uint32_t a[HD / 16][2][2];                     // [k-step][a0, a2][hi, lo]
  __device__ __forceinline__ q_frags_e4m3(const float* qs, int lane, int G) {
    const int g = lane / 4, t = lane % 4;
#pragma unroll
    for (int ks = 0; ks < HD / 16; ++ks) {
      const float4 x = g < G ? *reinterpret_cast<const float4*>(qs + g * HD + ks * 16 + 4 * t)
                             : make_float4(0.f, 0.f, 0.f, 0.f);
      const f16x2_split s0(x.x * E4M3_LIFT, x.y * E4M3_LIFT), s2(x.z * E4M3_LIFT, x.w * E4M3_LIFT);
      a[ks][0][0] = s0.hi; a[ks][0][1] = s0.lo;
      a[ks][1][0] = s2.hi; a[ks][1][1] = s2.lo;
    }
  }
};

// One tile's score products: matrix m of chunk group c4's codes r (k-step 4 c4 + m), into d (hi parts of
// q) and d_lo (lo parts, E4M3_LO only).
template <int HD>
__device__ __forceinline__ void scores_tile(float (&d)[4], float (&d_lo)[4], const q_frags_e4m3<HD>& q, int c4,
                                            const uint32_t (&r)[4]) {
#pragma unroll
  for (int m = 0; m < 4; ++m) {
    const int ks = 4 * c4 + m;
    const uint32_t b0 = e4m3x2_f16x2(r[m]), b1 = e4m3x2_f16x2(r[m] >> 16);
    mma_rows8_f16(d, q.a[ks][0][0], q.a[ks][1][0], b0, b1);
    if (E4M3_LO) mma_rows8_f16(d_lo, q.a[ks][0][1], q.a[ks][1][1], b0, b1);
  }
}

// Scores of keys [kr.j0, j1), as attn_scores_mma, each times its key's scale. Whole tiles of history
// keys (before the own row, inside the pass) first, with addresses stepped and no bounds checked; then
// the rest, each key checked.
template <int HD>
__device__ __forceinline__ void attn_scores_mma(const attn_view& c, const q_frags_e4m3<HD>& q, float* sc, float& top,
                                                const kv_rows<mvm_e4m3>& kr, int j1, int n, int G, int KW) {
  const int g = c.lane / 4, t = c.lane % 4, mi = c.lane / 8, ri = c.lane % 8;
  const int u0 = kr.j0 / 8, x = kv_xor(kr.t0 + ri, kr.sw);    // tiles start at multiples of 8 keys
  int u = u0 + ((c.warp - u0) % KW + KW) % KW;
  const int jh = MVM_ATTN_WHOLE_TILES ? min(j1, kr.jo) : kr.j0;  // whole tiles end here (0: none)
  if (u * 8 + 8 <= jh) {
    const int at = u * 8 - kr.j0;
    uint32_t row = smem_addr(kr.rows) + (at + ri) * HD, sa = kr.ss + 4 * (at + 2 * t);
    float* out = sc + min(g, G - 1) * n + u * 8 + 2 * t;
#pragma unroll 1
    for (; u * 8 + 8 <= jh; u += KW, row += KW * 8 * HD, sa += KW * 32, out += KW * 8) {
      const float s0 = __uint_as_float(lds32(sa)), s1 = __uint_as_float(lds32(sa + 4));   // staged / E4M3_LIFT
      float d[4] = {}, d_lo[4] = {};
#pragma unroll
      for (int c4 = 0; c4 < HD / 64; ++c4) {
        uint32_t r[4];
        ldsm_x4(row + 16 * ((4 * c4 + mi) ^ x), r);
        scores_tile<HD>(d, d_lo, q, c4, r);
      }
      if (g < G) {
        const float a = (d[0] + d_lo[0]) * s0, b = (d[1] + d_lo[1]) * s1;
        out[0] = a;
        out[1] = b;
        top = fmaxf(top, fmaxf(a, b));
      }
    }
  }
#pragma unroll 1
  for (; u * 8 < j1; u += KW) {
    const int j = u * 8 + ri;                    // the key whose row this lane names to ldmatrix
    const int k0 = u * 8 + 2 * t;                // this lane's two keys: their scales, staged in shared memory
    const float s0 = k0 < j1 ? kr.staged_scale(k0) : 0.f;         // staged / E4M3_LIFT
    const float s1 = k0 + 1 < j1 ? kr.staged_scale(k0 + 1) : 0.f;
    float d[4] = {}, d_lo[4] = {};
#pragma unroll
    for (int c4 = 0; c4 < HD / 64; ++c4) {       // k-steps 4 c4 .. 4 c4 + 3, one matrix each
      uint32_t r[4];
      ldsm_x4(mma_row(kr, j, j1, HD, (4 * c4 + mi) ^ x), r);
      scores_tile<HD>(d, d_lo, q, c4, r);
    }
    if (g < G) {
      if (k0 < j1) {
        const float s = (d[0] + d_lo[0]) * s0;
        sc[g * n + k0] = s;
        top = fmaxf(top, s);
      }
      if (k0 + 1 < j1) {
        const float s = (d[1] + d_lo[1]) * s1;
        sc[g * n + k0 + 1] = s;
        top = fmaxf(top, s);
      }
    }
  }
}

// One tile's value products: weights a0 (keys 2t, 2t + 1) and a2 (8 + 2t, 9 + 2t) of 16 keys, and their code
// words: matrix m of r0 (keys 0 .. 7) and r1 (8 .. 15) is chunk 4 c4 + m. keep0 / keep1 mask the codes of
// keys past the pass (stale ring bytes may be NaN codes).
template <int HD>
__device__ __forceinline__ void values_tile(float (&acc)[HD / 8][4], const f16x2_split& a0, const f16x2_split& a2,
                                            int c4, const uint32_t (&r0)[4], const uint32_t (&r1)[4], uint32_t keep0,
                                            uint32_t keep1) {
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    // bytes: key 2t code 2g, key 2t code 2g+1, key 2t+1 code 2g, key 2t+1 code 2g+1 -> even | odd
    const uint32_t q0 = __byte_perm(r0[e], 0, 0x3120), q1 = __byte_perm(r1[e], 0, 0x3120);
    const int nt = 2 * (4 * c4 + e);
    const uint32_t be0 = e4m3x2_f16x2(q0) & keep0, be1 = e4m3x2_f16x2(q1) & keep1;
    const uint32_t bo0 = e4m3x2_f16x2(q0 >> 16) & keep0, bo1 = e4m3x2_f16x2(q1 >> 16) & keep1;
    mma_rows8_f16(acc[nt], a0.hi, a2.hi, be0, be1);
    if (E4M3_LO) mma_rows8_f16(acc[nt], a0.lo, a2.lo, be0, be1);
    mma_rows8_f16(acc[nt + 1], a0.hi, a2.hi, bo0, bo1);
    if (E4M3_LO) mma_rows8_f16(acc[nt + 1], a0.lo, a2.lo, bo0, bo1);
  }
}

// Value sums of keys [vr.j0, j1), as attn_values_mma: weights p times the value rows' scales, acc[nt]
// in the n-tile order above. Whole tiles of history keys (before the own row, inside the pass) first,
// with addresses stepped and no bounds checked; then the rest, each key checked.
template <int HD>
__device__ __forceinline__ void attn_values_mma(const attn_view& c, const float* sc, float m, float (&acc)[HD / 8][4],
                                                float& w, const kv_rows<mvm_e4m3>& vr, int j1, int n, int G, int KW) {
  const int g = c.lane / 4, t = c.lane % 4, mi = c.lane / 8, ri = c.lane % 8;
  const int u0 = vr.j0 / 16, x = kv_xor(vr.t0 + ri, vr.sw);
  const float mL = m * 1.4426950408889634f;
  int u = u0 + ((c.warp - u0) % KW + KW) % KW;
  const int jh = MVM_ATTN_WHOLE_TILES ? min(j1, vr.jo) : vr.j0;  // whole tiles end here (0: none)
  if (u * 16 + 16 <= jh) {
    const float on = g < G ? 1.f : 0.f;          // lanes past the group weigh nothing
    const int at = u * 16 - vr.j0;
    uint32_t row = smem_addr(vr.rows) + (at + ri) * HD, sa = vr.ss + 4 * (at + 2 * t);
    const float* in = sc + min(g, G - 1) * n + u * 16 + 2 * t;
#pragma unroll 1
    for (; u * 16 + 16 <= jh; u += KW, row += KW * 16 * HD, sa += KW * 64, in += KW * 16) {
      float p[4];
      tile_weights(in, mL, on, p, w);
      const f16x2_split a0(p[0] * __uint_as_float(lds32(sa)), p[1] * __uint_as_float(lds32(sa + 4)));
      const f16x2_split a2(p[2] * __uint_as_float(lds32(sa + 32)), p[3] * __uint_as_float(lds32(sa + 36)));
#pragma unroll
      for (int c4 = 0; c4 < HD / 64; ++c4) {
        uint32_t r0[4], r1[4];
        ldsm_x4_trans(row + 16 * ((4 * c4 + mi) ^ x), r0);
        ldsm_x4_trans(row + 8 * HD + 16 * ((4 * c4 + mi) ^ x), r1);
        values_tile<HD>(acc, a0, a2, c4, r0, r1, ~0u, ~0u);
      }
    }
  }
  for (; u * 16 < j1; u += KW) {
    const int k0 = u * 16;
    float p[4], vs[4];                           // keys k0 + 2t, + 1, k0 + 8 + 2t, + 1; their (staged) scales
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int j = k0 + (e / 2) * 8 + 2 * t + (e & 1);
      vs[e] = j < j1 ? vr.staged_scale(j) : 0.f;               // staged x E4M3_LIFT
    }
    checked_weights(sc, n, g, G, k0, t, j1, mL, p, w);
#pragma unroll
    for (int e = 0; e < 4; ++e) p[e] *= vs[e];
    const f16x2_split a0(p[0], p[1]), a2(p[2], p[3]);
    const bool tail = k0 + 16 > j1;              // keys past the pass: zeroed (stale ring bytes may be NaN codes)
    const uint32_t keep0 = !tail ? ~0u : (k0 + 2 * t < j1 ? 0xffffu : 0u) | (k0 + 2 * t + 1 < j1 ? 0xffff0000u : 0u);
    const uint32_t keep1 = !tail ? ~0u : (k0 + 8 + 2 * t < j1 ? 0xffffu : 0u) | (k0 + 9 + 2 * t < j1 ? 0xffff0000u : 0u);
#pragma unroll
    for (int c4 = 0; c4 < HD / 64; ++c4) {
      uint32_t r0[4], r1[4];                     // matrix m: codes of chunk 4 c4 + m, keys k0 .. k0 + 7 (r0), + 8 .. (r1)
      ldsm_x4_trans(mma_row(vr, k0 + ri, j1, HD, (4 * c4 + mi) ^ x), r0);
      ldsm_x4_trans(mma_row(vr, k0 + 8 + ri, j1, HD, (4 * c4 + mi) ^ x), r1);
      values_tile<HD>(acc, a0, a2, c4, r0, r1, keep0, keep1);
    }
  }
}
