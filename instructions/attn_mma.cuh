// The attention partial's arithmetic on tensor cores (bf16 K/V rows in ring stages, head_dim 64, 128 or 256,
// at most 8 query heads a group): scores S = q K^T and value sums O = p V by mma.sync m16n8k16. q and p are
// f32: each is split into bf16 hi + lo parts and both are multiplied, so the products keep about 16 bits
// of q and p (K and V are bf16 already) and the sums are f32. The group's heads' hi parts are rows 0..7 of
// A and their lo parts rows 8..15, so one product gives both sums (mma_hilo; head_dim 256's scores, which
// split q at each use, take two products of rows 0..7, rows past the group zeros). A lane's share of the
// operands (PTX ISA, "mma.m16n8k16"), with g = lane / 4 and t = lane % 4: A (16 x 16, row) a0 = (g,
// 2t..2t+1), a1 = (g + 8, ..), a2 = (g, 2t+8..), a3 = (g + 8, 2t+8..); B (16 x 8, col) b0 = (2t..2t+1, g),
// b1 = (2t+8.., g); C c0, c1 = (g, 2t..2t+1), c2, c3 = (g + 8, ..). ldmatrix gives the B operands straight
// from the rows: K rows as they are (a matrix row is a key), V rows transposed.
#pragma once
#include "kv_rows.cuh"

// Four 8 x 8 bf16 matrices; lane i names row i % 8 of matrix i / 8. r[m]: matrix m, a lane's pair
// (row lane / 4, columns 2 (lane % 4) ..), or with .trans (column lane / 4, rows 2 (lane % 4) ..).
__device__ __forceinline__ void ldsm_x4(uint32_t addr, uint32_t (&r)[4]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}
__device__ __forceinline__ void ldsm_x4_trans(uint32_t addr, uint32_t (&r)[4]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}

// d += A B for A with only its rows 0..7 set (a1 = a3 = 0): the group's heads. Registers only (not
// volatile: the compiler may interleave independent ones).
__device__ __forceinline__ void mma_rows8(float (&d)[4], uint32_t a0, uint32_t a2, uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
               "{%0, %1, %2, %3};"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a0), "r"(0u), "r"(a2), "r"(0u), "r"(b0), "r"(b1));
}

// d += A B with A's rows 0..7 the hi parts of the group's heads and rows 8..15 their lo parts: one product
// gives both, the hi sums in c0, c1 and the lo sums in c2, c3, each accumulated in the order that two
// mma_rows8 chains would (a row's sums do not depend on the other rows), with half the instructions and no
// zero operands to move into place.
__device__ __forceinline__ void mma_hilo(float (&d)[4], uint32_t a0_hi, uint32_t a0_lo, uint32_t a2_hi, uint32_t a2_lo,
                                         uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0_hi), "r"(a0_lo), "r"(a2_hi), "r"(a2_lo), "r"(b0), "r"(b1));
}

// A weight p = e^(s - m) of the tensor-core partials, from mL = m log2(e): one ex2.approx.ftz (a few ulps of
// f32, far below the bf16 or f16 pairs the weight is rounded to next; weights below 2^-126 become 0).
__device__ __forceinline__ float exp_weight(float s, float mL) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(fmaf(s, 1.4426950408889634f, -mL)));
  return y;
}

// A whole value tile's weights of this lane's keys 2t, 2t + 1, 8 + 2t, 9 + 2t (their scores at in[0], in[1],
// in[8], in[9]), times on (0 for lanes past the group), and their sum added to w.
__device__ __forceinline__ void tile_weights(const float* in, float mL, float on, float (&p)[4], float& w) {
  p[0] = on * exp_weight(in[0], mL);
  p[1] = on * exp_weight(in[1], mL);
  p[2] = on * exp_weight(in[8], mL);
  p[3] = on * exp_weight(in[9], mL);
  w += (p[0] + p[1]) + (p[2] + p[3]);
}

// A checked value tile's weights of this lane's keys k0 + 2t, + 1, k0 + 8 + 2t, + 1 (0 past j1 or the group),
// and their sum added to w.
__device__ __forceinline__ void checked_weights(const float* sc, int n, int g, int G, int k0, int t, int j1, float mL,
                                                float (&p)[4], float& w) {
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    const int j = k0 + (e / 2) * 8 + 2 * t + (e & 1);
    p[e] = g < G && j < j1 ? exp_weight(sc[g * n + j], mL) : 0.f;
    w += p[e];
  }
}

// Two floats as bf16 pairs hi + lo (x = hi + lo to about 16 bits); the first float in the low half.
struct bf16x2_split {
  uint32_t hi, lo;
  __device__ __forceinline__ bf16x2_split(float x0, float x1) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(x0, x1);
    const float2 hf = __bfloat1622float2(h);
    const __nv_bfloat162 l = __floats2bfloat162_rn(x0 - hf.x, x1 - hf.y);
    hi = *reinterpret_cast<const uint32_t*>(&h);
    lo = *reinterpret_cast<const uint32_t*>(&l);
  }
};

// The shared-memory address of 16-byte chunk ch (8 bf16 or 16 e4m3 elements) of key j's row: a row of
// the pass's stage, or the own row (key jo, and every key past the pass: their products are never used,
// and a value tile's rows past the pass are zeroed). ch is the chunk's swizzled place (kv_rows::piece):
// in a tile of 8 keys, which starts at a multiple of 8, lane ri's key keeps chunk c at c ^ kv_xor(t0 +
// ri), so the 8 keys hold chunk c on 8 different bank groups.
template <typename T>
__device__ __forceinline__ uint32_t mma_row(const kv_rows<T>& kr, int j, int j1, int hd, int ch) {
  const T* p = j == kr.jo || j >= j1 ? kr.own : kr.rows + (long)(j - kr.j0) * hd;
  return smem_addr(p + ch * (16 / (int)sizeof(T)));
}

// The query heads' A operands for every 16 elements of head_dim: hi and lo parts of rows g < G (the
// pre-scaled q in shared memory), zeros past the group.
template <int HD> struct q_frags {
  uint32_t a[HD / 16][2][2];                     // [k-step][a0, a2][hi, lo]
  __device__ __forceinline__ q_frags(const float* qs, int lane, int G) {
    const int g = lane / 4, t = lane % 4;
#pragma unroll
    for (int ks = 0; ks < HD / 16; ++ks)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float2 x = g < G ? *reinterpret_cast<const float2*>(qs + g * HD + ks * 16 + h * 8 + 2 * t)
                               : make_float2(0.f, 0.f);
        const bf16x2_split s(x.x, x.y);
        a[ks][h][0] = s.hi;
        a[ks][h][1] = s.lo;
      }
  }
};

// At head_dim 256 the operands are split from the pre-scaled q in shared memory at each use: held in
// registers (64 of them), they made the kernel's main loop spill around the partial's call.
template <> struct q_frags<256> {
  const float* row;                              // this lane's head (clamped to the group) at element 2t
  bool on;
  __device__ __forceinline__ q_frags(const float* qs, int lane, int G)
      : row(qs + min(lane / 4, G - 1) * 256 + 2 * (lane % 4)), on(lane / 4 < G) {}
  __device__ __forceinline__ bf16x2_split split(int ks, int h) const {   // a0 (h 0) or a2 (h 1) of k-step ks
    const float2 x = on ? *reinterpret_cast<const float2*>(row + ks * 16 + h * 8) : make_float2(0.f, 0.f);
    return bf16x2_split(x.x, x.y);
  }
};

// One tile's score products: the chunks of group c4 (k-steps 2 c4, 2 c4 + 1) into two independent sums (the
// hi and lo parts of q), added at the end.
template <int HD>
__device__ __forceinline__ void scores_tile(float (&d)[2][4], const q_frags<HD>& q, int c4, const uint32_t (&b)[4]) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int ks = 2 * c4 + h;
    if constexpr (HD == 256) {
      const bf16x2_split a0 = q.split(ks, 0), a2 = q.split(ks, 1);
      mma_rows8(d[0], a0.hi, a2.hi, b[2 * h], b[2 * h + 1]);
      mma_rows8(d[1], a0.lo, a2.lo, b[2 * h], b[2 * h + 1]);
    } else {                                     // the hi sums in d[0][0..1], the lo sums in d[0][2..3]
      mma_hilo(d[0], q.a[ks][0][0], q.a[ks][0][1], q.a[ks][1][0], q.a[ks][1][1], b[2 * h], b[2 * h + 1]);
    }
  }
}

// A bf16 sum: mma_hilo's hi and lo sums of element i (0 or 1) of a lane's pair added.
__device__ __forceinline__ float hilo_sum(const float (&a)[4], int i) { return a[i] + a[i + 2]; }

// A score tile's element i of a lane's pair: its hi and lo sums added (head_dim 256: d[0] and d[1]).
template <int HD>
__device__ __forceinline__ float tile_score(const float (&d)[2][4], int i) {
  return HD == 256 ? d[0][i] + d[1][i] : hilo_sum(d[0], i);
}

// Scores of keys [kr.j0, j1) on tensor cores: each warp takes tiles of 8 keys (tile u of the launch's
// keys goes to warp u % KW), writes sc[g n + j] for its heads g < G and keeps its lanes' maxima in top.
// Whole tiles of history keys (before the own row, inside the pass) first, with addresses stepped and no
// bounds checked; then the rest, each key checked.
template <int HD>
__device__ __forceinline__ void attn_scores_mma(const attn_view& c, const q_frags<HD>& q, float* sc, float& top,
                                                const kv_rows<__nv_bfloat16>& kr, int j1, int n, int G, int KW) {
  const int g = c.lane / 4, t = c.lane % 4, mi = c.lane / 8, ri = c.lane % 8;
  const int u0 = kr.j0 / 8, x = (kr.t0 + ri) & 7;
  int u = u0 + ((c.warp - u0) % KW + KW) % KW;
  const int jh = MVM_ATTN_WHOLE_TILES ? min(j1, kr.jo) : kr.j0;  // whole tiles end here (0: none)
  if (u * 8 + 8 <= jh) {
    uint32_t row = smem_addr(kr.rows) + (u * 8 - kr.j0 + ri) * HD * 2;
    float* out = sc + min(g, G - 1) * n + u * 8 + 2 * t;
#pragma unroll 1
    for (; u * 8 + 8 <= jh; u += KW, row += KW * 8 * HD * 2, out += KW * 8) {
      float d[2][4] = {};
#pragma unroll
      for (int c4 = 0; c4 < HD / 32; ++c4) {     // chunks 4 c4 .. 4 c4 + 3: k-steps 2 c4 and 2 c4 + 1
        uint32_t b[4];
        ldsm_x4(row + 16 * ((4 * c4 + mi) ^ x), b);
        scores_tile<HD>(d, q, c4, b);
      }
      if (g < G) {
        const float a = tile_score<HD>(d, 0), e = tile_score<HD>(d, 1);
        out[0] = a;
        out[1] = e;
        top = fmaxf(top, fmaxf(a, e));
      }
    }
  }
#pragma unroll 1
  for (; u * 8 < j1; u += KW) {
    const int j = u * 8 + ri;                    // the key whose row this lane names to ldmatrix
    float d[2][4] = {};
#pragma unroll
    for (int c4 = 0; c4 < HD / 32; ++c4) {
      uint32_t b[4];
      ldsm_x4(mma_row(kr, j, j1, HD, (4 * c4 + mi) ^ x), b);
      scores_tile<HD>(d, q, c4, b);
    }
    const float a = tile_score<HD>(d, 0), e = tile_score<HD>(d, 1);
    const int k0 = u * 8 + 2 * t;
    if (g < G) {
      if (k0 < j1) { sc[g * n + k0] = a; top = fmaxf(top, a); }
      if (k0 + 1 < j1) { sc[g * n + k0 + 1] = e; top = fmaxf(top, e); }
    }
  }
}

// One tile's value products: weights a0 (keys 2t, 2t + 1) and a2 (8 + 2t, 9 + 2t), hi and lo parts, and
// chunk group c4's rows b0 (keys 0 .. 7) and b1 (8 .. 15).
template <int HD>
__device__ __forceinline__ void values_tile(float (&acc)[HD / 8][4], const bf16x2_split& a0, const bf16x2_split& a2,
                                            int c4, const uint32_t (&b0)[4], const uint32_t (&b1)[4]) {
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    mma_hilo(acc[4 * c4 + e], a0.hi, a0.lo, a2.hi, a2.lo, b0[e], b1[e]);   // hi sums in c0, c1, lo in c2, c3
  }
}

// Value sums of keys [vr.j0, j1) on tensor cores: each warp takes tiles of 16 keys (tile u to the key
// split u % KW; this warp is split ks), weights p = exp(sc[g n + j] - m) for its lanes' head g; acc[nt]
// holds (g, elements 8 nt + 2t, 8 nt + 2t + 1) of the sums past element 8 cb, w the lane's part of the
// weights' sum. Rows are HD elements; a warp sums HV of them (HV < HD: head_dim 256, four warps a split,
// each a quarter: halves made the kernel's main loop spill around the partial's call). Whole tiles of
// history keys first, as the scores.
template <int HD, int HV = HD>
__device__ __forceinline__ void attn_values_mma(const attn_view& c, const float* sc, float m, float (&acc)[HV / 8][4],
                                                float& w, const kv_rows<__nv_bfloat16>& vr, int j1, int n, int G,
                                                int KW, int ks, int cb) {
  const int g = c.lane / 4, t = c.lane % 4, mi = c.lane / 8, ri = c.lane % 8;
  const int u0 = vr.j0 / 16, x = (vr.t0 + ri) & 7;
  const float mL = m * 1.4426950408889634f;
  int u = u0 + ((ks - u0) % KW + KW) % KW;
  const int jh = MVM_ATTN_WHOLE_TILES ? min(j1, vr.jo) : vr.j0;  // whole tiles end here (0: none)
  if (u * 16 + 16 <= jh) {
    const float on = g < G ? 1.f : 0.f;          // lanes past the group weigh nothing
    uint32_t row = smem_addr(vr.rows) + (u * 16 - vr.j0 + ri) * HD * 2;
    const float* in = sc + min(g, G - 1) * n + u * 16 + 2 * t;
#pragma unroll 1
    for (; u * 16 + 16 <= jh; u += KW, row += KW * 16 * HD * 2, in += KW * 16) {
      float p[4];
      tile_weights(in, mL, on, p, w);
      const bf16x2_split a0(p[0], p[1]), a2(p[2], p[3]);
#pragma unroll
      for (int c4 = 0; c4 < HV / 32; ++c4) {
        uint32_t b0[4], b1[4];
        ldsm_x4_trans(row + 16 * ((cb + 4 * c4 + mi) ^ x), b0);
        ldsm_x4_trans(row + 8 * HD * 2 + 16 * ((cb + 4 * c4 + mi) ^ x), b1);
        values_tile<HV>(acc, a0, a2, c4, b0, b1);
      }
    }
  }
  for (; u * 16 < j1; u += KW) {
    const int k0 = u * 16;
    float p[4];                                  // keys k0 + 2t, + 1, k0 + 8 + 2t, + 1
    checked_weights(sc, n, g, G, k0, t, j1, mL, p, w);
    const bf16x2_split a0(p[0], p[1]), a2(p[2], p[3]);
    const bool tail = k0 + 16 > j1;              // keys past the pass: their rows are zeroed (stale ring bytes)
#pragma unroll
    for (int c4 = 0; c4 < HV / 32; ++c4) {
      uint32_t b0[4], b1[4];                     // chunk cb + 4 c4 + m: keys k0 .. k0 + 7 (b0), k0 + 8 .. (b1)
      ldsm_x4_trans(mma_row(vr, k0 + ri, j1, HD, (cb + 4 * c4 + mi) ^ x), b0);
      ldsm_x4_trans(mma_row(vr, k0 + 8 + ri, j1, HD, (cb + 4 * c4 + mi) ^ x), b1);
      if (tail) {
        const uint32_t keep0 = (k0 + 2 * t < j1 ? 0xffffu : 0u) | (k0 + 2 * t + 1 < j1 ? 0xffff0000u : 0u);
        const uint32_t keep1 = (k0 + 8 + 2 * t < j1 ? 0xffffu : 0u) | (k0 + 9 + 2 * t < j1 ? 0xffff0000u : 0u);
#pragma unroll
        for (int e = 0; e < 4; ++e) { b0[e] &= keep0; b1[e] &= keep1; }
      }
      values_tile<HV>(acc, a0, a2, c4, b0, b1);
    }
  }
}
