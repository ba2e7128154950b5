// The streamed matrix-vector core every projection opcode shares: the activation vector (RMSNorm
// applied when asked) in shared memory, weight rows arriving through the ring in 16-byte pieces,
// per-row sums reduced in a fixed order (bitwise-reproducible). Two paths: the register path for rows
// of whole 4 KiB chunks, and the row-per-warp path for every other shape.
#pragma once
#include <cuda_fp8.h>
#include "device.cuh"

// An e4m3 weight code, as stored (F8E4M3 buffers: each row times its f32 scale, applied to the row's sum).
struct mvm_e4m3 {
  uint8_t bits;
};
// Two NVFP4 (e2m1) weight codes, element 2i in the low nibble (E2M1 buffers: each block of 16 codes
// times its e4m3 block scale, each row's sum times its f32 scale). Row-per-warp path only.
struct mvm_e2m1x2 {
  uint8_t bits;
};
// Elements per 16-byte piece of a weight type.
template <typename T> struct piece_of { static constexpr int EPP = 16 / sizeof(T); };
template <> struct piece_of<mvm_e2m1x2> { static constexpr int EPP = 32; };

// ---- the register path: a consumer thread owns fixed columns, their activations in registers ----
// A chunk is one 16-byte piece per consumer thread (NCT * 16 bytes of consecutive weights). When a
// weight row is KP whole chunks (KP in 1, 2, 4, 8), thread t meets columns [EPP (t + NCT j), +EPP)
// of every row, j < KP: its activations stay in registers for the whole tile and each weight piece is
// one shared-memory load, with no activation reads beside it.
constexpr int CHUNK_BYTES = NCT * 16;
constexpr int CPS = STAGE_BYTES / CHUNK_BYTES;  // chunks per ring stage
static_assert(STAGE_BYTES % CHUNK_BYTES == 0 && (CPS == 1 || CPS == 2 || CPS == 4),
              "MVM_STAGE_BYTES must be 1, 2 or 4 chunks of 16 bytes per consumer thread");
constexpr int PART_FLOATS = NCW * ACC_ROWS;     // per-warp row sums, at the top of xs
static_assert(PART_FLOATS < MEGAVM_MAX_K, "per-warp sums must fit in xs");

// Chunks per row of weight buffer w_buf on the register path, or 0 where it does not apply.
__device__ __forceinline__ int gemv_kp(const mvm_ctx& c, int w_buf) {
  const mvm_buffer_t& b = bufinfo(c, w_buf);
  const long K = b.shape[b.ndim - 1], row_bytes = K * elem_bytes(b.dtype);
  if (row_bytes % CHUNK_BYTES != 0 || K > MEGAVM_MAX_K - PART_FLOATS) return 0;
  // KP and CPS are both powers of two, so a ring stage holds whole rows (KP <= CPS) or whole parts of one
  const long kp = row_bytes / CHUNK_BYTES;
  return kp == 1 || kp == 2 || kp == 4 || kp == 8 ? (int)kp : 0;
}

// The activation vector's layout in shared memory, in 2^split runs. On the row-per-warp path with
// bf16 weights a 16-byte piece holds 8 weights, which meet x[8q .. 8q+8): xs keeps x[8q .. 8q+4) at
// 4q and x[8q+4 .. 8q+8) at K/2 + 4q (split 1), so the 32 lanes of a warp read two runs of
// consecutive 16-byte words (no bank conflicts) instead of one run with a 32-byte stride. An e4m3
// piece (16 codes) meets x[16q .. 16q+16): four runs of K/4 (split 2); an e2m1 piece (32 codes) eight
// runs of K/8 (split 3). Otherwise (split 0) xs is x.
__device__ __forceinline__ int xs_split(const mvm_ctx& c, int w_buf) {
  const int dt = bufinfo(c, w_buf).dtype;
  return dt == MVM_F32 || gemv_kp(c, w_buf) != 0 ? 0 : dt == MVM_BF16 ? 1 : dt == MVM_E2M1 ? 3 : 2;
}
__device__ __forceinline__ int xs_index(int i, int K, int split) {
  return split == 0 ? i : ((i >> 2) & ((1 << split) - 1)) * (K >> split) + ((i >> (2 + split)) << 2) + (i & 3);
}

// Before the wait (weights never wait): xs[0:K] = gamma, the RMSNorm weight of the next instruction.
// One 16-byte read-only load per thread per round (K = 2048 in bf16: one round). Element by element
// through a generic pointer, the compiler kept each load behind the shared-memory store before it (they
// might alias): one memory round trip per element, 7% of llama-1b's warp samples (ncu, 979361b).
template <typename G>
__device__ void prefetch_gamma_t(mvm_ctx& c, const G* gamma, int K, int split) {
  constexpr int V = 16 / sizeof(G);              // elements per load
  const int vec = K % 16 == 0 && (reinterpret_cast<uintptr_t>(gamma) & 15) == 0 ? K : 0;
  for (int i = c.tid * V; i < vec; i += NCT * V) {
    const uint4 raw = __ldg(reinterpret_cast<const uint4*>(gamma + i));
    const G* g = reinterpret_cast<const G*>(&raw);
#pragma unroll
    for (int e = 0; e < V; e += 4)
      *reinterpret_cast<float4*>(c.s.xs + xs_index(i + e, K, split)) =
          make_float4(to_f(g[e]), to_f(g[e + 1]), to_f(g[e + 2]), to_f(g[e + 3]));
  }
  for (int i = vec + c.tid; i < K; i += NCT) c.s.xs[xs_index(i, K, split)] = to_f(__ldg(gamma + i));
}
__device__ __forceinline__ void prefetch_gamma(mvm_ctx& c, int gamma_buf, int w_buf) {
  const int K = (int)bufinfo(c, gamma_buf).shape[0];
  if (bufinfo(c, gamma_buf).dtype == MVM_BF16)
    prefetch_gamma_t(c, (const __nv_bfloat16*)buf(c, gamma_buf), K, xs_split(c, w_buf));
  else
    prefetch_gamma_t(c, (const float*)buf(c, gamma_buf), K, xs_split(c, w_buf));
}

// After the wait: xs = x (f32), or gamma * x / rms(x) when normed (gamma already in xs), in the
// layout above. Ends with a consumer_sync.
__device__ float load_x(mvm_ctx& c, const float* x, bool normed, int K, float eps, int split) {
  float ss = 0.f;
  for (int i = c.tid * 4; i < K; i += NCT * 4) {
    const float4 v = __ldcg(reinterpret_cast<const float4*>(x + i));
    float4* d = reinterpret_cast<float4*>(c.s.xs + xs_index(i, K, split));
    if (normed) {
      const float4 g = *d;
      *d = make_float4(g.x * v.x, g.y * v.y, g.z * v.z, g.w * v.w);
    } else {
      *d = v;
    }
    ss += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
  }
  if (!normed) {
    consumer_sync();
    return 1.f;
  }
  const float rstd = rsqrtf(consumer_sum(c, ss) / (float)K + eps);
  for (int i = c.tid; i < K; i += NCT) c.s.xs[i] *= rstd;
  consumer_sync();
  return rstd;
}

// The 16-byte piece w against the activations it meets: piece q of a row (q counted from column 0)
// is at xs + 4q (f32: and that is all; bf16: and xs + K/2 + 4q; e4m3: and xs + j K/4 + 4q, j < 4;
// `half` is the length of one run).
template <typename T>
__device__ __forceinline__ float dot16(const uint4& w, const float* x, int half);

// Four e4m3 codes (one 32-bit word, code 0 in the low byte) as floats: the hardware's e4m3x2 -> f16x2
// conversion, then f16 -> f32. (Building the f32 bits with integer operations, exact too, was slower:
// llama-7b-32k 3.857 against 3.638 ms, H100.)
__device__ __forceinline__ float4 e4m3x4(uint32_t u) {
  const __half2_raw lo = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(u & 0xffffu), __NV_E4M3);
  const __half2_raw hi = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(u >> 16), __NV_E4M3);
  const float2 a = __half22float2(__half2(lo)), b = __half22float2(__half2(hi));
  return make_float4(a.x, a.y, b.x, b.y);
}
// A piece of 16 codes against x[j] = its activations 4j .. 4j+4, as two FMA chains (both paths).
__device__ __forceinline__ float dot_e4m3(const uint4& w, const float4 (&x)[4]) {
  const uint32_t u[4] = {w.x, w.y, w.z, w.w};
  float s = 0.f, t = 0.f;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const float4 v = e4m3x4(u[j]);
    float& a = (j & 1) ? t : s;
    a = fmaf(v.x, x[j].x, a); a = fmaf(v.y, x[j].y, a); a = fmaf(v.z, x[j].z, a); a = fmaf(v.w, x[j].w, a);
  }
  return s + t;
}
template <>
__device__ __forceinline__ float dot16<mvm_e4m3>(const uint4& w, const float* x, int half) {
  const float4 xv[4] = {*reinterpret_cast<const float4*>(x), *reinterpret_cast<const float4*>(x + half),
                        *reinterpret_cast<const float4*>(x + 2 * half), *reinterpret_cast<const float4*>(x + 3 * half)};
  return dot_e4m3(w, xv);
}
// Eight e2m1 codes (one 32-bit word, element 0 in the low nibble) against their activations a
// (elements 0..3) and b (4..7), added to s. Codes k and k + 4 become one f16x2 whose values are the
// codes' times 2^-14: each nibble's exponent and mantissa bits land on the f16's bits 9..11 and its
// sign on bit 15 (exact; the codes 0 and 0.5 come out as f16 zero and subnormal). The caller scales
// by 2^14.
__device__ __forceinline__ float dot_e2m1x8(uint32_t u, const float4& a, const float4& b, float s) {
  const float xa[4] = {a.x, a.y, a.z, a.w}, xb[4] = {b.x, b.y, b.z, b.w};
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const uint32_t t = u >> (4 * k);
    const uint32_t h = ((t & 0x00070007u) << 9) | ((t & 0x00080008u) << 12);
    const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&h));
    s = fmaf(f.x, xa[k], s);
    s = fmaf(f.y, xb[k], s);
  }
  return s;
}
// A piece of 32 e2m1 codes (two blocks of 16) against its activations (x + m half: elements 4m .. 4m+4)
// and its blocks' e4m3 scales sc2 (block 0 in the low byte), times 2^-14.
__device__ __forceinline__ float dot_e2m1(const uint4& w, const float* x, int half, uint32_t sc2) {
  float4 xv[8];
#pragma unroll
  for (int m = 0; m < 8; ++m) xv[m] = *reinterpret_cast<const float4*>(x + m * half);
  const float s0 = dot_e2m1x8(w.y, xv[2], xv[3], dot_e2m1x8(w.x, xv[0], xv[1], 0.f));
  const float s1 = dot_e2m1x8(w.w, xv[6], xv[7], dot_e2m1x8(w.z, xv[4], xv[5], 0.f));
  const __half2_raw r = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)sc2, __NV_E4M3);
  const float2 bs = __half22float2(__half2(r));
  return fmaf(s0, bs.x, s1 * bs.y);
}
template <>
__device__ __forceinline__ float dot16<__nv_bfloat16>(const uint4& w, const float* x, int half) {
  const float4 x0 = *reinterpret_cast<const float4*>(x), x1 = *reinterpret_cast<const float4*>(x + half);
  const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&w);
  const float2 a = __bfloat1622float2(h[0]), b = __bfloat1622float2(h[1]);
  const float2 d = __bfloat1622float2(h[2]), e = __bfloat1622float2(h[3]);
  float s = a.x * x0.x, t = d.x * x1.x;          // two independent chains of four
  s = fmaf(a.y, x0.y, s); t = fmaf(d.y, x1.y, t);
  s = fmaf(b.x, x0.z, s); t = fmaf(e.x, x1.z, t);
  s = fmaf(b.y, x0.w, s); t = fmaf(e.y, x1.w, t);
  return s + t;
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
  float* part;                                   // the per-warp row sums of the register path (top of xs)
  uint32_t full0, empty0;                        // shared addresses of full[0], empty[0]
  int stage;
  uint32_t phase;
  int warp, lane;
  bool direct;
};

// This warp is done with the current ring stage: hand it back to the loader and move on.
__device__ __forceinline__ void release_stage(gemv_view& v) {
  __syncwarp();
  if (v.lane == 0) mbar_arrive(v.empty0 + 8 * v.stage);
  if (++v.stage == STAGES) { v.stage = 0; v.phase ^= 1u; }
}

// bs (e2m1 only): the tile's block scales, row r's at bs + r K/16 (one 16-bit pair per piece).
template <typename T>
__device__ __forceinline__ int2 gemv_core(gemv_view v, const T* gsrc, int nrows, int K, float* acc,
                                          const unsigned char* bs = nullptr) {
  constexpr int EPP = piece_of<T>::EPP;          // elements per 16-byte piece
  constexpr int RUNS = EPP / 4;                  // runs of xs (xs_split): 1, 2, 4 or 8
  constexpr int CHUNK = STAGE_BYTES / 16 * EPP;  // elements per stage
  constexpr bool E2M1 = EPP == 32;
  const int total = nrows * K;                   // <= MAX_TILE_ROWS * MAX_K
  int r = v.warp;
  float sum = 0.f, sum2 = 0.f;
  for (int e0 = 0; e0 < total; e0 += CHUNK) {
    const int e1 = total - e0 < CHUNK ? total : e0 + CHUNK;
    const uint4* w;
    if (v.direct) {
      w = reinterpret_cast<const uint4*>(gsrc) + e0 / EPP;
    } else {
      while (!mbar_try_wait(v.full0 + 8 * v.stage, v.phase)) {}
      w = reinterpret_cast<const uint4*>(v.ring + (long)v.stage * STAGE_BYTES);
    }
    while (r < nrows) {
      const int rs = r * K;
      if (rs >= e1) break;                       // my next row starts in a later stage
      const int re = rs + K;
      const int p_lo = ((rs > e0 ? rs : e0) - e0) / EPP;
      const int p_hi = ((re < e1 ? re : e1) - e0) / EPP;
      const float* x = v.xs + (e0 - rs) / EPP * 4; // the activations of the piece at stage offset 0
      const int half = K / RUNS;                 // one run of xs
      int p = p_lo + v.lane;
      if constexpr (E2M1) {                      // the row's block-scale pairs, indexed like the pieces
        const uint16_t* sp = reinterpret_cast<const uint16_t*>(bs + (long)r * (K / 16)) + (e0 - rs) / EPP;
        for (; p + 32 < p_hi; p += 64) {
          const uint32_t sa = __ldg(sp + p), sb = __ldg(sp + p + 32);
          const uint4 wa = v.direct ? __ldcs(w + p) : w[p];
          const uint4 wb = v.direct ? __ldcs(w + p + 32) : w[p + 32];
          sum += dot_e2m1(wa, x + p * 4, half, sa);
          sum2 += dot_e2m1(wb, x + (p + 32) * 4, half, sb);
        }
        if (p < p_hi) sum += dot_e2m1(v.direct ? __ldcs(w + p) : w[p], x + p * 4, half, __ldg(sp + p));
      } else {
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
      if (v.lane == 0) acc[r] = sum;
      sum = sum2 = 0.f;
      r += NCW;
    }
    if (!v.direct) release_stage(v);
  }
  consumer_sync();
  return make_int2(v.stage, (int)v.phase);
}

// ---- the register path (gemv_kp above) ----
__device__ __forceinline__ uint4 lds128(uint32_t addr) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(addr));
  return v;
}

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
// part[warp][row] (the top of xs); the warps' sums are added in warp order at the end, so results are
// bitwise reproducible (and DIRECT, straight from global memory, computes the same sums).
template <typename T, int KP, bool DIRECT>
__device__ __noinline__ int2 gemv_regs(gemv_view v, const T* gsrc, int nrows, float* acc) {
  constexpr int EPP = 16 / sizeof(T);
  const int t = v.warp * 32 + v.lane;
  float x[KP][EPP];
#pragma unroll
  for (int j = 0; j < KP; ++j)
#pragma unroll
    for (int e = 0; e < EPP; e += 4) {
      const float4 f = *reinterpret_cast<const float4*>(v.xs + (t + NCT * j) * EPP + e);
      x[j][e] = f.x; x[j][e + 1] = f.y; x[j][e + 2] = f.z; x[j][e + 3] = f.w;
    }
  float* part = v.part + v.warp * ACC_ROWS;
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
        rs[i] = dot_piece(w[i * KP], x[0]);
#pragma unroll
        for (int j = 1; j < KP; ++j) rs[i] += dot_piece(w[i * KP + j], x[j]);
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
          for (int k = 0; k < CPS; ++k) run += dot_piece(w[k], x[g * CPS + k]);
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
  const float* parts = v.part;
  for (int r = t; r < nrows; r += NCT) {
    float a = parts[r];
#pragma unroll
    for (int w = 1; w < NCW; ++w) a += parts[w * ACC_ROWS + r];
    acc[r] = a;
  }
  consumer_sync();
  return make_int2(v.stage, (int)v.phase);
}

template <typename T, bool DIRECT>
__device__ __forceinline__ int2 gemv_regs_kp(int kp, const gemv_view& v, const T* gsrc, int nrows, float* acc) {
  switch (kp) {
    case 1: return gemv_regs<T, 1, DIRECT>(v, gsrc, nrows, acc);
    case 2: return gemv_regs<T, 2, DIRECT>(v, gsrc, nrows, acc);
    case 4: return gemv_regs<T, 4, DIRECT>(v, gsrc, nrows, acc);
    default:                                     // e4m3 rows are at most 4 chunks (MAX_K codes)
      if constexpr (sizeof(T) == 1) return gemv_regs<T, 4, DIRECT>(v, gsrc, nrows, acc);
      else return gemv_regs<T, 8, DIRECT>(v, gsrc, nrows, acc);
  }
}

// ---- the e2m1 tensor-core path (build knob MVM_E2M1_MMA=1; research, not the default) ----
// One mma.m16n8k16 (f16 in, f32 sums) covers 16 weight rows x 16 codes. A: a lane's e2m1 pairs (codes
// k and k + 4 of a 32-bit word, as dot_e2m1x8 builds them: code x 2^-14) times their block's e4m3
// scale, exact in f16. B: the activations split hi + lo into columns 0 and 1 (lanes g = 0 and 1),
// the other columns zero, so each row's sum is D[row][0] + D[row][1] with f32-like precision. The
// activations are read once per 16 rows. Taken where a 16-row block spans whole ring stages (K a
// multiple of 2048), the tile is whole 16-row blocks, and the fragments and the tile's block scales
// fit above x in xs (2K floats + nrows K/16 bytes <= MAX_K - PART_FLOATS floats); a dense matrix
// through the ring only.
#if MVM_E2M1_MMA
// (the default build compiles none of it: a larger callee made the main loop spill 100 bytes)
#define MVM_IF_E2M1_MMA(...) __VA_ARGS__
constexpr int E2M1_MMA_K = 2048;                 // codes in a row whose 16 rows fill one ring stage
static_assert(STAGE_BYTES == 16 * E2M1_MMA_K / 2, "the e2m1 tensor-core path assumes 16 KiB ring stages");

// dense: a matrix (not a stack) whose activations start at xs (the caller knows); the rest here.
__device__ __forceinline__ bool e2m1_mma_fits(const gemv_view& v, bool dense, int nrows, int K) {
  return MVM_E2M1_MMA && dense && !v.direct && K % E2M1_MMA_K == 0 && nrows % 16 == 0 && K / E2M1_MMA_K <= STAGES &&
         4 * (2 * K) + nrows * (K / 16) <= 4 * (MEGAVM_MAX_K - PART_FLOATS);
}

// xs (split-3 layout, K floats) -> the B fragments at frag: per 32-code piece p, 16 f16x2 words of
// hi, then 16 of lo; word 2j (2j + 1) of mma j holds codes (8w + 2h, 8w + 2h + 4) (their + 1), w = j / 2,
// h = j % 2: the pairs the A side builds. Also the tile's block scales (n bytes from bs, 16-byte
// aligned) into scs, their loads issued first so their round trip overlaps the conversion. Ends with
// a consumer_sync.
__device__ void e2m1_fragments(const gemv_view& v, int K, uint32_t* frag, const unsigned char* bs, int n,
                               uint4* scs) {
  const int t = v.warp * 32 + v.lane;
  for (int i = t; i < n / 16; i += NCT) scs[i] = __ldg(reinterpret_cast<const uint4*>(bs) + i);
  for (int i = t; i < K / 2; i += NCT) {          // one word of hi and one of lo per (piece, word)
    const int p = i >> 4, q = i & 15, j = q >> 1, w = j >> 1, h = j & 1;
    const int e = 32 * p + 8 * w + 2 * h + (q & 1);
    const float a = v.xs[xs_index(e, K, 3)], b = v.xs[xs_index(e + 4, K, 3)];
    const __half ah = __float2half_rn(a), bh = __float2half_rn(b);
    const __half al = __float2half_rn(a - __half2float(ah)), bl = __float2half_rn(b - __half2float(bh));
    const __half2 hi = __halves2half2(ah, bh), lo = __halves2half2(al, bl);
    frag[32 * p + q] = *reinterpret_cast<const uint32_t*>(&hi);
    frag[32 * p + 16 + q] = *reinterpret_cast<const uint32_t*>(&lo);
  }
  consumer_sync();
}

// The f16x2 of codes k and k + 4 of word u (dot_e2m1x8's bits) times a block scale m.
__device__ __forceinline__ uint32_t e2m1_pair(uint32_t u, int k, __half2 m) {
  const uint32_t t = u >> (4 * k);
  const uint32_t h = ((t & 0x00070007u) << 9) | ((t & 0x00080008u) << 12);
  const __half2 r = __hmul2(*reinterpret_cast<const __half2*>(&h), m);
  return *reinterpret_cast<const uint32_t*>(&r);
}

// acc[r] = the tile's row r . x (times 2^-14) for a tile of whole 16-row blocks; warp w takes the
// 128-code column groups w, w + NCW, ... of every block, its sums go to part[w][r] and are added in
// warp order at the end (bitwise reproducible).
__device__ int2 gemv_e2m1_mma(gemv_view v, int nrows, int K, float* acc, const unsigned char* bs) {
  uint32_t* frag = reinterpret_cast<uint32_t*>(v.xs + K);
  const unsigned char* scs = reinterpret_cast<const unsigned char*>(v.xs + 2 * K);   // the tile's block scales
  e2m1_fragments(v, K, frag, bs, nrows * (K / 16), reinterpret_cast<uint4*>(v.xs + 2 * K));
  const int g = v.lane >> 2, tq = v.lane & 3, n = K / E2M1_MMA_K, rowb = K / 2;
  const uint32_t ring0 = smem_addr(v.ring), frag0 = smem_addr(frag);
  float* part = v.part + v.warp * ACC_ROWS;
  for (int r0 = 0; r0 < nrows; r0 += 16) {
    for (int i = 0; i < n; ++i) {                // the block's n stages, all landed
      const int s = v.stage + i;
      while (!mbar_try_wait(v.full0 + 8 * (s % STAGES), v.phase ^ (s >= STAGES ? 1u : 0u))) {}
    }
    float d[4] = {0.f, 0.f, 0.f, 0.f};
    for (int cg = v.warp; cg < K / 128; cg += NCW) {
      const int p = 4 * cg + tq;                 // this lane's piece of rows g and g + 8
      const int ba = g * rowb + 16 * p, bb = (g + 8) * rowb + 16 * p;
      const uint4 wa = lds128(ring0 + ((v.stage + ba / STAGE_BYTES) % STAGES) * STAGE_BYTES + ba % STAGE_BYTES);
      const uint4 wb = lds128(ring0 + ((v.stage + bb / STAGE_BYTES) % STAGES) * STAGE_BYTES + bb % STAGE_BYTES);
      const uint32_t sa = reinterpret_cast<const uint16_t*>(scs + (r0 + g) * (K / 16))[p];
      const uint32_t sb = reinterpret_cast<const uint16_t*>(scs + (r0 + g + 8) * (K / 16))[p];
      const __half2_raw ra = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)sa, __NV_E4M3);
      const __half2_raw rb = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)sb, __NV_E4M3);
      const __half2 ma = __half2(ra), mb = __half2(rb);
      uint4 b0, b1, b2, b3;                      // the 16 B words of piece p (hi for g = 0, lo for g = 1)
      if (g < 2) {
        const uint32_t fa = frag0 + 4 * (32 * p + 16 * g);
        b0 = lds128(fa); b1 = lds128(fa + 16); b2 = lds128(fa + 32); b3 = lds128(fa + 48);
      } else {
        b0 = b1 = b2 = b3 = make_uint4(0, 0, 0, 0);
      }
      const uint32_t ua[4] = {wa.x, wa.y, wa.z, wa.w}, ub[4] = {wb.x, wb.y, wb.z, wb.w};
      const uint32_t bw[16] = {b0.x, b0.y, b0.z, b0.w, b1.x, b1.y, b1.z, b1.w,
                               b2.x, b2.y, b2.z, b2.w, b3.x, b3.y, b3.z, b3.w};
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const int w = j >> 1, h = j & 1;
        const __half2 m = w < 2 ? __low2half2(ma) : __high2half2(ma);
        const __half2 m8 = w < 2 ? __low2half2(mb) : __high2half2(mb);
        const uint32_t a0 = e2m1_pair(ua[w], 2 * h, m), a2 = e2m1_pair(ua[w], 2 * h + 1, m);
        const uint32_t a1 = e2m1_pair(ub[w], 2 * h, m8), a3 = e2m1_pair(ub[w], 2 * h + 1, m8);
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
                     "{%8, %9}, {%0, %1, %2, %3};"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                     : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(bw[2 * j]), "r"(bw[2 * j + 1]));
      }
    }
    for (int i = 0; i < n; ++i) release_stage(v);
    if (tq == 0) {                               // columns 0 and 1: hi and lo
      part[r0 + g] = d[0] + d[1];
      part[r0 + g + 8] = d[2] + d[3];
    }
  }
  consumer_sync();
  const int t = v.warp * 32 + v.lane;
  for (int r = t; r < nrows; r += NCT) {
    float a = v.part[r];
#pragma unroll
    for (int w = 1; w < NCW; ++w) a += v.part[w * ACC_ROWS + r];
    acc[r] = a;
  }
  consumer_sync();
  return make_int2(v.stage, (int)v.phase);
}
#else
#define MVM_IF_E2M1_MMA(...)
#endif

// The packed streams (e4m3 on both paths, e2m1 on the row-per-warp path), one out-of-line function:
// their conversions would otherwise add their registers to every opcode that inlines a GEMV, and one
// call site costs the inlining opcodes fewer registers than one per format. info: the weight's
// buffer, whose f32 row scales are buffer info.scale (and an e2m1 weight's e4m3 block scales, [rows,
// K/16], buffer info.block_scale); expert: the matrix of a stack; off: the stream's byte offset in the
// matrix (its first row times the row's bytes). The tile's row scales are loaded before its rows
// stream and applied to their sums after. The loader prefetched e2m1 block scales into L2
// (vm/kernel/loader.cuh).
__device__ __noinline__ int2 gemv_packed(gemv_view v, const void* gsrc, int nrows, int K, int kp, float* acc,
                                         const float* sc, const unsigned char* bs,
                                         uint32_t off MVM_IF_E2M1_MMA(, bool dense)) {
  const int t = v.warp * 32 + v.lane;
  const bool e2m1 = bs != nullptr;
  const long row0 = off / (uint32_t)(e2m1 ? K / 2 : K);
  sc += row0;
  const float s0 = t < nrows ? __ldg(sc + t) : 0.f;
  int2 rp;
  if (e2m1) {
    bs += row0 * (K / 16);
    MVM_IF_E2M1_MMA(if (e2m1_mma_fits(v, dense, nrows, K)) rp = gemv_e2m1_mma(v, nrows, K, acc, bs); else)
    rp = gemv_core<mvm_e2m1x2>(v, (const mvm_e2m1x2*)gsrc, nrows, K, acc, bs);
  } else {
    const mvm_e4m3* w = (const mvm_e4m3*)gsrc;
    rp = kp == 0 ? gemv_core<mvm_e4m3>(v, w, nrows, K, acc)
         : v.direct ? gemv_regs_kp<mvm_e4m3, true>(kp, v, w, nrows, acc)
                    : gemv_regs_kp<mvm_e4m3, false>(kp, v, w, nrows, acc);
  }
  const float k = e2m1 ? 16384.f : 1.f;         // 2^14: dot_e2m1's codes are 2^-14 of their values
  for (int r = t; r < nrows; r += NCT) acc[r] *= k * (r == t ? s0 : __ldg(sc + r));
  consumer_sync();
  return rp;
}

// Consume one weight stream of nrows x K elements (the instruction's next stream in the ring, or
// straight from global memory under the direct-loads ablation): acc[r] = W[r] . xs for r < nrows.
// Warp w owns rows w, w + NCW, ...; warps walk the stream's stages independently (no block barrier
// per stage) and each hands a stage back once done with it. Per-row sums: lanes in piece order, then
// a fixed butterfly, so results are bitwise reproducible. Each lane keeps two pieces and two sums
// in flight (the loop is latency-bound: a piece is one shared-memory load and eight FMAs).
// T: f32 or bf16; the packed formats take gemv_packed (gemv below).
template <typename T>
__device__ __forceinline__ void gemv_stream(mvm_ctx& c, const T* gsrc, int nrows, int K, int kp, float* acc,
                                            int xs_at = 0) {
  const gemv_view v{c.s.ring[0], c.s.xs + xs_at, c.s.xs + (MEGAVM_MAX_K - PART_FLOATS), smem_addr(&c.s.full[0]),
                    smem_addr(&c.s.empty[0]), c.stage, c.phase, c.warp, c.lane, c.direct};
  const int2 rp = kp == 0 ? gemv_core<T>(v, gsrc, nrows, K, acc)
                  : c.direct ? gemv_regs_kp<T, true>(kp, v, gsrc, nrows, acc)
                             : gemv_regs_kp<T, false>(kp, v, gsrc, nrows, acc);
  c.stage = rp.x;
  c.phase = (uint32_t)rp.y;
}

// Dispatch on the weight dtype of stream si (its buffer is the instruction's weight operand).
// The stream's byte offset already selects the tile's first row; `expert` selects the matrix of a
// stack [experts, rows, K] (a late-bound stream's run for that expert, which the loader opened), and
// xs_at where in xs the activation vector starts (several vectors loaded at once; the register
// path's row sums stay at the top of xs, so xs_at + K must stay below MAX_K - PART_FLOATS).
__device__ __forceinline__ void gemv(mvm_ctx& c, int si, int w_buffer, int nrows, int K, float* acc, int expert = 0,
                                     int xs_at = 0) {
  const mvm_buffer_t& info = bufinfo(c, w_buffer);
  const unsigned char* base = (const unsigned char*)buf(c, w_buffer) + c.ins->streams[si].byte_offset +
                              (expert ? (uint64_t)expert * (info.nbytes / (uint64_t)info.shape[0]) : 0);
  const int kp = gemv_kp(c, w_buffer);
  if (info.dtype == MVM_F8E4M3 || info.dtype == MVM_E2M1) {
    const gemv_view v{c.s.ring[0], c.s.xs + xs_at, c.s.xs + (MEGAVM_MAX_K - PART_FLOATS), smem_addr(&c.s.full[0]),
                      smem_addr(&c.s.empty[0]), c.stage, c.phase, c.warp, c.lane, c.direct};
    const long m = info.ndim == 3 ? expert * info.shape[1] : 0;    // the matrix's first row in a stack
    const int2 rp = gemv_packed(v, base, nrows, K, kp, acc, (const float*)buf(c, info.scale) + m,
                                info.dtype == MVM_E2M1 ? (const unsigned char*)buf(c, info.block_scale) + m * (K / 16)
                                                       : nullptr,
                                (uint32_t)c.ins->streams[si].byte_offset MVM_IF_E2M1_MMA(, xs_at == 0 && info.ndim == 2));
    c.stage = rp.x;
    c.phase = (uint32_t)rp.y;
  } else if (info.dtype == MVM_BF16) {
    gemv_stream<__nv_bfloat16>(c, reinterpret_cast<const __nv_bfloat16*>(base), nrows, K, kp, acc, xs_at);
  } else {
    gemv_stream<float>(c, reinterpret_cast<const float*>(base), nrows, K, kp, acc, xs_at);
  }
}

// Load x into xs, normalised when the instruction has a gamma (prefetched into xs before the wait).
// (its layout set by the dtype of the weights w_buf it will meet).
__device__ __forceinline__ float load_x_norm(mvm_ctx& c, int x_buf, bool normed, int K, float eps, int w_buf) {
  return load_x(c, (const float*)buf(c, x_buf), normed, K, eps, xs_split(c, w_buf));
}
