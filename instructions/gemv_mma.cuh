// The e2m1 GEMV on tensor cores (build knob MVM_E2M1_MMA=1): see below.
#pragma once
#include "gemv_core.cuh"

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
  for (int r = t; r < nrows; r += NCT) acc[r] = warp_order_sum(v, r);
  consumer_sync();
  return make_int2(v.stage, (int)v.phase);
}
#else
#define MVM_IF_E2M1_MMA(...)
#endif
