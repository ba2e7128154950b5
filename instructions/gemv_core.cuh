// The streamed matrix-vector core every projection opcode shares: the activation vector (RMSNorm
// applied when asked) in shared memory, weight rows arriving through the ring in 16-byte pieces,
// per-row sums reduced in a fixed order (bitwise-reproducible). Two paths: the register path for rows
// of whole 4 KiB chunks, and the row-per-warp path for every other shape (bf16 rows of K <=
// MVM_ROW_PAIRS_MAX_K take gemv.cuh's gemv_rows_bf16 instead, two rows a warp by shared address; packed
// 4-bit rows of K = 2048 take gemv_xreg.cuh's gemv_xreg, their activations held in registers).
#pragma once
#include <type_traits>
#include "codes.cuh"
#include "tagged.cuh"

// The warp's sums of R rows in one butterfly (below).
template <int R>
__device__ __forceinline__ float warp_sum_rows(float (&v)[R], int lane, int& row);

// ---- the register path: a consumer thread owns fixed columns, their activations in registers ----
// A chunk is one 16-byte piece per consumer thread (NCT * 16 bytes of consecutive weights). When a
// weight row is KP whole chunks (KP in 1, 2, 4, 8), thread t meets columns [EPP (t + NCT j), +EPP)
// of every row, j < KP: its activations stay in registers for the whole tile and each weight piece is
// one shared-memory load, with no activation reads beside it.
constexpr int CHUNK_BYTES = NCT * 16;
constexpr int CPS = STAGE_BYTES / CHUNK_BYTES;  // chunks per ring stage
static_assert(STAGE_BYTES % CHUNK_BYTES == 0 && (CPS == 1 || CPS == 2 || CPS == 4),
              "MVM_STAGE_BYTES must be 1, 2 or 4 chunks of 16 bytes per consumer thread");
constexpr int PART_FLOATS = NCW * ACC_ROWS;     // the most per-warp row sums (NCW x a tile's rows): top of xs
static_assert(PART_FLOATS < MEGAVM_MAX_K, "per-warp sums must fit in xs");
// The longest row the register path takes: fixed by the capacity, not by the build's xs, so that every
// build a program may run on (vm/sizing.py) takes the same path for a row and computes the same bits.
// A build sized to a program holds its GEMVs' K + NCW x rows (instructions/tiles.py: gemv_shared).
constexpr int REG_MAX_K = MEGAVM_MAX_K_CAPACITY - PART_FLOATS;

// Chunks per row of weight buffer w_buf on the register path, or 0 where it does not apply.
__device__ __forceinline__ int gemv_kp(const mvm_ctx& c, int w_buf) {
  const mvm_buffer_t& b = bufinfo(c, w_buf);
  const long K = b.shape[b.ndim - 1], row_bytes = K * elem_bytes(b.dtype);
  if (row_bytes % CHUNK_BYTES != 0 || K > REG_MAX_K) return 0;
  // KP and CPS are both powers of two, so a ring stage holds whole rows (KP <= CPS) or whole parts of one
  const long kp = row_bytes / CHUNK_BYTES;
  if (b.block_scale >= 0 && b.dtype == MVM_F8E4M3) return kp == 1 ? 1 : 0;    // block scales: one chunk a row
  return kp == 1 || kp == 2 || kp == 4 || kp == 8 ? (int)kp : 0;
}

// The activation vector's layout in shared memory, in 2^split runs. On the row-per-warp path with
// bf16 weights a 16-byte piece holds 8 weights, which meet x[8q .. 8q+8): xs keeps x[8q .. 8q+4) at
// 4q and x[8q+4 .. 8q+8) at K/2 + 4q (split 1), so the 32 lanes of a warp read two runs of
// consecutive 16-byte words (no bank conflicts) instead of one run with a 32-byte stride. An e4m3
// piece (16 codes) meets x[16q .. 16q+16): four runs of K/4 (split 2); an e2m1 or int4 piece (32 codes) eight
// runs of K/8 (split 3). Otherwise (split 0) xs is x.
__device__ __forceinline__ int xs_split(const mvm_ctx& c, int w_buf) {
  const int dt = bufinfo(c, w_buf).dtype;
  return dt == MVM_F32 || gemv_kp(c, w_buf) != 0 ? 0 : dt == MVM_BF16 ? 1 : dt == MVM_E2M1 || dt == MVM_U4 ? 3 : 2;
}
__device__ __forceinline__ int xs_index(int i, int K, int split) {
  return split == 0 ? i : ((i >> 2) & ((1 << split) - 1)) * (K >> split) + ((i >> (2 + split)) << 2) + (i & 3);
}

// The 16-byte piece w against the activations it meets: piece q of a row (q counted from column 0)
// is at xs + 4q (f32: and that is all; bf16: and xs + K/2 + 4q; `half` is the length of one run). The
// packed codes read theirs through shared-memory loads (dot_e4m3_s, dot_e2m1, dot_u4: run m at xs +
// m half + 4q).
template <typename T>
__device__ __forceinline__ float dot16(const uint4& w, const float* x, int half);

// A bf16 piece against x0 (its elements 0..3) and x1 (4..7): two independent chains of four.
__device__ __forceinline__ float dot16x(const uint4& w, const float4& x0, const float4& x1) {
  const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&w);
  const float2 a = __bfloat1622float2(h[0]), b = __bfloat1622float2(h[1]);
  const float2 d = __bfloat1622float2(h[2]), e = __bfloat1622float2(h[3]);
  float s = a.x * x0.x, t = d.x * x1.x;
  s = fmaf(a.y, x0.y, s); t = fmaf(d.y, x1.y, t);
  s = fmaf(b.x, x0.z, s); t = fmaf(e.x, x1.z, t);
  s = fmaf(b.y, x0.w, s); t = fmaf(e.y, x1.w, t);
  return s + t;
}
template <>
__device__ __forceinline__ float dot16<__nv_bfloat16>(const uint4& w, const float* x, int half) {
  return dot16x(w, *reinterpret_cast<const float4*>(x), *reinterpret_cast<const float4*>(x + half));
}
template <>
__device__ __forceinline__ float dot16<float>(const uint4& w, const float* x, int) {
  const float4 xv = *reinterpret_cast<const float4*>(x);
  float s = __uint_as_float(w.x) * xv.x;
  s = fmaf(__uint_as_float(w.y), xv.y, s); s = fmaf(__uint_as_float(w.z), xv.z, s);
  return fmaf(__uint_as_float(w.w), xv.w, s);
}

// What the streaming loop needs of the block, by value (ring position in, ring position out).
struct gemv_view {
  const unsigned char* ring;                     // stage 0 of the ring
  float* xs;                                     // the activation vector (xs, or a later vector in it)
  float* part;                                   // the top PART_FLOATS of xs: the register path's per-warp row sums
  uint32_t full0, empty0;                        // shared addresses of full[0], empty[0]
  int stage;
  uint32_t phase;
  int warp, lane;
  bool direct;
};

// Row r's per-warp sums in v.part (warp w's at w ACC_ROWS + r), added in warp order (the tensor-core paths').
__device__ __forceinline__ float warp_order_sum(const gemv_view& v, int r) {
  float a = v.part[r];
#pragma unroll
  for (int w = 1; w < NCW; ++w) a += v.part[w * ACC_ROWS + r];
  return a;
}

// This warp is done with the current ring stage: hand it back to the loader and move on.
__device__ __forceinline__ void release_stage(gemv_view& v) {
  __syncwarp();
  if (v.lane == 0) mbar_arrive(v.empty0 + 8 * v.stage);
  if (++v.stage == STAGES) { v.stage = 0; v.phase ^= 1u; }
}

// bs (e2m1): the tile's block scales, row r's at bs + r K/16 (one 16-bit pair per piece); (int4): the
// tile's group table, row r's at bs + r K/32 (one 32-bit word, f16 scale and zero, per 4 pieces);
// (e4m3 with block scales): the matrix's f32 scale per 128 x 128 block, row r's block row (r + r0) / 128
// (one word per 8 pieces); (mxfp4): the tile's e8m0 exponents, row r's at bs + r K/32 (a byte per piece).
// ADD: acc[r] += wr * (row r's sum) instead of acc[r] = (row r's sum), and no block barrier at the end
// (warp w owns rows w, w + NCW, ... of every call, so calls in sequence add in call order).
template <typename T, bool ADD = false>
__device__ __forceinline__ int2 gemv_core(gemv_view v, const T* gsrc, int nrows, int K, float* acc,
                                          const unsigned char* bs = nullptr, int r0 = 0, float wr = 0.f) {
  constexpr int EPP = piece_of<T>::EPP;          // elements per 16-byte piece
  constexpr int RUNS = EPP / 4;                  // runs of xs (xs_split): 1, 2, 4 or 8
  constexpr int CHUNK = STAGE_BYTES / 16 * EPP;  // elements per stage
  constexpr bool E2M1 = std::is_same<T, mvm_e2m1x2>::value, U4 = std::is_same<T, mvm_u4x2>::value;
  constexpr bool B128 = std::is_same<T, mvm_e4m3b>::value;
  constexpr bool MX = std::is_same<T, mvm_mx4x2>::value;
  constexpr bool PACKED = E2M1 || U4 || B128 || MX || std::is_same<T, mvm_e4m3>::value;
  const uint32_t xs0 = smem_addr(v.xs);          // packed codes: x's shared address
  const int total = nrows * K;                   // <= MAX_TILE_ROWS * MAX_K
  int r = v.warp;
  float sum = 0.f, sum2 = 0.f;
  for (int e0 = 0; e0 < total; e0 += CHUNK) {
    const int e1 = total - e0 < CHUNK ? total : e0 + CHUNK;
    const uint4* w;
    uint32_t ring0 = 0;                          // packed codes: the stage's shared address
    if (v.direct) {
      w = reinterpret_cast<const uint4*>(gsrc) + e0 / EPP;
    } else {
      while (!mbar_try_wait(v.full0 + 8 * v.stage, v.phase)) {}
      w = reinterpret_cast<const uint4*>(v.ring + (long)v.stage * STAGE_BYTES);
      if constexpr (PACKED) ring0 = smem_addr(w);
    }
    while (r < nrows) {
      const int rs = r * K;
      if (rs >= e1) break;                       // my next row starts in a later stage
      const int re = rs + K;
      const int p_lo = ((rs > e0 ? rs : e0) - e0) / EPP;
      const int p_hi = ((re < e1 ? re : e1) - e0) / EPP;
      const int half = K / RUNS;                 // one run of xs
      int p = p_lo + v.lane;
      if constexpr (PACKED) {                    // codes: x and the ring through shared-memory loads
        const int at = (e0 - rs) / EPP;          // the row's piece at stage offset 0
        const int hb = 4 * half;                 // one run of xs, in bytes
        auto scale_row = [&](int rr) -> const unsigned char* {   // row rr's scale words
          return bs + (E2M1 ? (long)rr * (K / 16) : U4 || MX ? (long)rr * (K / 32)
                       : B128 ? (long)((rr + r0) >> 7) * ((K + 127) >> 7) * 4 : 0);
        };
        auto word_of = [&](const unsigned char* sr, int q) -> uint32_t {   // the scale word of piece q
          if constexpr (E2M1 || U4 || MX) return scale_word<T>(sr, q);
          else if constexpr (B128) return __float_as_uint(__ldg(reinterpret_cast<const float*>(sr) + (q >> 3)));
          else return 0u;
        };
        const unsigned char* srow = scale_row(r);
        auto word = [&](int q) -> uint32_t { return word_of(srow, q); };
        auto dot = [&](const uint4& wq, int q, uint32_t s) -> float {
          const uint32_t xa = xs0 + 16 * q;
          if constexpr (E2M1) return dot_e2m1(wq, xa, hb, s);
          else if constexpr (U4) return dot_u4(wq, xa, hb, s);
          else if constexpr (B128) return __uint_as_float(s) * dot_e4m3_s(wq, xa, hb);
          else if constexpr (MX) return dot_mx(wq, xa, hb, s);
          else return dot_e4m3_s(wq, xa, hb);
        };
        auto piece = [&](int q) -> uint4 { return v.direct ? __ldcs(w + q) : lds128(ring0 + 16 * q); };
        if constexpr ((U4 && (MVM_TWO_ROWS & 1)) || (E2M1 && (MVM_TWO_ROWS & 2)) || (MX && (MVM_TWO_ROWS & 4))) {
          // rows r and r + NCW whole in this stage, at most two pieces a lane: both at once, each run of
          // activations read once for both, their sums in one butterfly
          if (K <= 64 * EPP && rs >= e0 && r + NCW < nrows && re + NCW * K <= e1) {
            const unsigned char* srow2 = scale_row(r + NCW);
            const int np = K / EPP, pb = p_lo + NCW * np;
            float da = 0.f, db = 0.f;
#pragma unroll
            for (int h2 = 0; h2 < 2; ++h2) {
              const int q = v.lane + 32 * h2;
              if (q < np) {
                const uint32_t sa = word(q), sb = word_of(srow2, q);
                const uint4 wa = piece(p_lo + q), wb = piece(pb + q);
                float4 xv[8];
                load_runs8(xv, xs0 + 16 * q, hb);
                da += dot_codes32<T>(wa, xv, sa);
                db += dot_codes32<T>(wb, xv, sb);
              }
            }
            float both[2] = {da, db};
            int which;
            const float tot = warp_sum_rows<2>(both, v.lane, which);
            if ((v.lane & 15) == 0) {
              const int rr = r + which * NCW;
              acc[rr] = ADD ? __fmaf_rn(wr, tot, acc[rr]) : tot;
            }
            r += 2 * NCW;
            continue;
          }
        }
        for (; p + 96 < p_hi; p += 128) {        // four pieces in flight: their scale words first
          const uint32_t s0 = word(p + at), s1 = word(p + 32 + at), s2 = word(p + 64 + at), s3 = word(p + 96 + at);
          const uint4 w0 = piece(p), w1 = piece(p + 32), w2 = piece(p + 64), w3 = piece(p + 96);
          sum += dot(w0, p + at, s0) + dot(w2, p + 64 + at, s2);
          sum2 += dot(w1, p + 32 + at, s1) + dot(w3, p + 96 + at, s3);
        }
        if (p + 32 < p_hi) {                     // two
          const uint32_t s0 = word(p + at), s1 = word(p + 32 + at);
          const uint4 w0 = piece(p), w1 = piece(p + 32);
          sum += dot(w0, p + at, s0);
          sum2 += dot(w1, p + 32 + at, s1);
          p += 64;
        }
        if (p < p_hi) sum += dot(piece(p), p + at, word(p + at));
      } else {
        const float* x = v.xs + (e0 - rs) / EPP * 4;   // the activations of the piece at stage offset 0
        for (; p + 32 < p_hi; p += 64) {
          const uint4 wa = v.direct ? __ldcs(w + p) : w[p];
          const uint4 wb = v.direct ? __ldcs(w + p + 32) : w[p + 32];
          sum += dot16<T>(wa, x + p * 4, half);
          sum2 += dot16<T>(wb, x + (p + 32) * 4, half);
        }
        if (p < p_hi) sum += dot16<T>(v.direct ? __ldcs(w + p) : w[p], x + p * 4, half);
      }
      if (re > e1) break;                        // the row goes on in the next stage
      sum = warp_sum(sum + sum2);
      if (v.lane == 0) acc[r] = ADD ? __fmaf_rn(wr, sum, acc[r]) : sum;
      sum = sum2 = 0.f;
      r += NCW;
    }
    if (!v.direct) release_stage(v);
  }
  if (!ADD) consumer_sync();
  return make_int2(v.stage, (int)v.phase);
}

// ---- the register path (gemv_kp above) ----

// One 16-byte piece against the EPP activations of its columns, as two FMA chains.
__device__ __forceinline__ float dot_piece(const uint4& w, const float (&x)[8]) {
  const uint32_t u[4] = {w.x, w.y, w.z, w.w};
  float s = __uint_as_float(u[0] << 16) * x[0], t = __uint_as_float(u[2] << 16) * x[4];
  s = fmaf(__uint_as_float(u[0] & 0xffff0000u), x[1], s); t = fmaf(__uint_as_float(u[2] & 0xffff0000u), x[5], t);
  s = fmaf(__uint_as_float(u[1] << 16), x[2], s);         t = fmaf(__uint_as_float(u[3] << 16), x[6], t);
  s = fmaf(__uint_as_float(u[1] & 0xffff0000u), x[3], s); t = fmaf(__uint_as_float(u[3] & 0xffff0000u), x[7], t);
  return s + t;
}
__device__ __forceinline__ float dot_piece(const uint4& w, const float (&x)[16]) {
  const float4 xv[4] = {make_float4(x[0], x[1], x[2], x[3]), make_float4(x[4], x[5], x[6], x[7]),
                        make_float4(x[8], x[9], x[10], x[11]), make_float4(x[12], x[13], x[14], x[15])};
  return dot_e4m3(w, xv);
}
__device__ __forceinline__ float dot_piece(const uint4& w, const float (&x)[4]) {
  float s = __uint_as_float(w.x) * x[0], t = __uint_as_float(w.z) * x[2];
  s = fmaf(__uint_as_float(w.y), x[1], s);
  t = fmaf(__uint_as_float(w.w), x[3], t);
  return s + t;
}

// The warp's sums of R rows (R = 1, 2 or 4 values per lane) in a fixed butterfly: exchanging halves
// first, so R rows cost R - 1 + log2(32 / R) shuffles instead of 5 R. Row i's total ends up in lane
// 32 i / R; returns this lane's total and sets row (meaningful in those lanes).
template <int R>
__device__ __forceinline__ float warp_sum_rows(float (&v)[R], int lane, int& row) {
  float k;
  if constexpr (R == 1) {
    k = v[0];
    row = 0;
  } else if constexpr (R == 2) {
    const bool hi = lane & 16;
    k = (hi ? v[1] : v[0]) + __shfl_xor_sync(0xffffffffu, hi ? v[0] : v[1], 16);
    row = hi;
  } else {
    static_assert(R == 4, "1, 2 or 4 rows");
    const bool hi = lane & 16, mid = lane & 8;
    const float a = (hi ? v[2] : v[0]) + __shfl_xor_sync(0xffffffffu, hi ? v[0] : v[2], 16);
    const float b = (hi ? v[3] : v[1]) + __shfl_xor_sync(0xffffffffu, hi ? v[1] : v[3], 16);
    k = (mid ? b : a) + __shfl_xor_sync(0xffffffffu, mid ? a : b, 8);
    row = 2 * hi + mid;
  }
  for (int o = 32 / R / 2; o > 0; o >>= 1) k += __shfl_xor_sync(0xffffffffu, k, o);
  return k;
}

// acc[r] = W[r] . xs for r < nrows, W streamed as KP chunks per row. Warps walk the ring stages
// independently; each stage's CPS pieces per thread are loaded at once. A warp's row sums go to
// part[warp][row] (NCW x nrows floats, ending at the top of xs); the warps' sums are added in warp order
// at the end, so results are bitwise reproducible (and DIRECT, straight from global memory, computes the
// same sums). e4m3 with block scales (mvm_e4m3b): each piece's sum times its 128 x 128 block's scale,
// bs: the matrix's f32 scales [ceil(rows/128), nkb], r0: the tile's first row in the matrix (a thread's
// pieces keep their column block, so a row's scale is one load per piece).
template <typename T, int KP, bool DIRECT>
__device__ __noinline__ int2 gemv_regs(gemv_view v, const T* gsrc, int nrows, float* acc, const float* bs = nullptr,
                                       int r0 = 0, int nkb = 0) {
  constexpr int EPP = 16 / sizeof(T);
  constexpr bool B128 = std::is_same<T, mvm_e4m3b>::value;
  const int t = v.warp * 32 + v.lane;
  float x[KP][EPP];
#pragma unroll
  for (int j = 0; j < KP; ++j)
#pragma unroll
    for (int e = 0; e < EPP; e += 4) {
      const float4 f = *reinterpret_cast<const float4*>(v.xs + (t + NCT * j) * EPP + e);
      x[j][e] = f.x; x[j][e + 1] = f.y; x[j][e + 2] = f.z; x[j][e + 3] = f.w;
    }
  float* const parts = v.part + (PART_FLOATS - NCW * nrows);   // only the tile's rows: K + NCW nrows fit xs
  float* part = parts + v.warp * nrows;
  const int nchunks = nrows * KP;
  const uint32_t ring0 = smem_addr(v.ring) + 16 * t;
  float run = 0.f;                               // KP > CPS: the row so far
  for (int c0 = 0; c0 < nchunks; c0 += CPS) {
    uint4 w[CPS];
    if constexpr (DIRECT) {
      const uint4* g = reinterpret_cast<const uint4*>(gsrc) + (long)c0 * NCT + t;
#pragma unroll
      for (int k = 0; k < CPS; ++k) w[k] = c0 + k < nchunks ? __ldcs(g + k * NCT) : make_uint4(0, 0, 0, 0);
    } else {
      while (!mbar_try_wait(v.full0 + 8 * v.stage, v.phase)) {}
      const uint32_t a = ring0 + v.stage * STAGE_BYTES;
#pragma unroll
      for (int k = 0; k < CPS; ++k) w[k] = c0 + k < nchunks ? lds128(a + k * CHUNK_BYTES) : make_uint4(0, 0, 0, 0);
    }
    if constexpr (KP <= CPS) {
      constexpr int RPS = CPS / KP;              // whole rows in this stage
      float rs[RPS];
#pragma unroll
      for (int i = 0; i < RPS; ++i) {
        if constexpr (B128) {
          const float* sp = bs + (long)((r0 + c0 / KP + i) >> 7) * nkb;
          rs[i] = __ldg(sp + (t >> 3)) * dot_piece(w[i * KP], x[0]);
#pragma unroll
          for (int j = 1; j < KP; ++j) rs[i] = fmaf(__ldg(sp + ((t + NCT * j) >> 3)), dot_piece(w[i * KP + j], x[j]), rs[i]);
        } else {
          rs[i] = dot_piece(w[i * KP], x[0]);
#pragma unroll
          for (int j = 1; j < KP; ++j) rs[i] += dot_piece(w[i * KP + j], x[j]);
        }
      }
      if constexpr (!DIRECT) release_stage(v);
      int i;
      const float tot = warp_sum_rows<RPS>(rs, v.lane, i);
      const int r = c0 / KP + i;
      if ((v.lane & (32 / RPS - 1)) == 0 && r < nrows) part[r] = tot;
    } else {
      const int j0 = c0 % KP;                    // this stage holds pieces j0 .. j0 + CPS of one row
#pragma unroll
      for (int g = 0; g < KP / CPS; ++g)
        if (j0 == g * CPS) {
#pragma unroll
          for (int k = 0; k < CPS; ++k) {
            if constexpr (B128)
              run = fmaf(__ldg(bs + (long)((r0 + c0 / KP) >> 7) * nkb + ((t + NCT * (g * CPS + k)) >> 3)),
                         dot_piece(w[k], x[g * CPS + k]), run);
            else
              run += dot_piece(w[k], x[g * CPS + k]);
          }
        }
      if constexpr (!DIRECT) release_stage(v);
      if (j0 + CPS == KP) {
        const float tot = warp_sum(run);
        if (v.lane == 0) part[c0 / KP] = tot;
        run = 0.f;
      }
    }
  }
  consumer_sync();
  for (int r = t; r < nrows; r += NCT) {
    float a = parts[r];
#pragma unroll
    for (int w = 1; w < NCW; ++w) a += parts[w * nrows + r];
    acc[r] = a;
  }
  consumer_sync();
  return make_int2(v.stage, (int)v.phase);
}

template <typename T, bool DIRECT>
__device__ __forceinline__ int2 gemv_regs_kp(int kp, const gemv_view& v, const T* gsrc, int nrows, float* acc,
                                             const float* bs = nullptr, int r0 = 0, int nkb = 0) {
  switch (kp) {
    case 1: return gemv_regs<T, 1, DIRECT>(v, gsrc, nrows, acc, bs, r0, nkb);
    case 2: return gemv_regs<T, 2, DIRECT>(v, gsrc, nrows, acc, bs, r0, nkb);
    case 4: return gemv_regs<T, 4, DIRECT>(v, gsrc, nrows, acc, bs, r0, nkb);
    default:                                     // e4m3 rows are at most 4 chunks (MAX_K codes)
      if constexpr (sizeof(T) == 1) return gemv_regs<T, 4, DIRECT>(v, gsrc, nrows, acc, bs, r0, nkb);
      else return gemv_regs<T, 8, DIRECT>(v, gsrc, nrows, acc);
  }
}
