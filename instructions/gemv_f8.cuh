// NVFP4 rows on e4m3 mma.sync (build knob MVM_E2M1_F8: the fewest tile rows it takes, 96 by default; 0: off):
// tiles of a 2-D weight of K = 2048 or 4096 that gemv_xreg does not take (by default those of K = 4096) and
// whose fragments fit in xs above x. gemv_packed calls it where e2m1_f8_takes says so, in place of gemv_core's
// row-per-warp loop. sm_90 has no e4m3 mma.sync: ptxas turns each into f16 unpacks of A and B and two f16 HMMAs
// (wgmma is Hopper's FP8 path: bench/probes/wgmma_e2m1_gemv.cu). bench/probes/e4m3_mma_gemv.cu measured the loop
// alone; docs/quantization.md ("NVFP4 on e4m3 mma.sync") has the kernel's numbers.
#pragma once
#include "gemv_core.cuh"

// How it computes a row's sum:
// - A: an e2m1 code's bits shifted left by two are the e4m3 bits of the code times 2^-6, exactly (e2m1's
//   subnormal 0.5 lands on e4m3's subnormals), so a word of 8 codes is two 4-code A registers of
//   mma.m16n8k32 (its even and its odd codes) after two shifts and two LOP3s.
// - B: warp w owns codes [w K/8, (w + 1) K/8) of every row. Its x, times a power of two (the largest
//   into [128, 256)), is four e4m3 parts: part p is what parts 0 .. p - 1 left, times 16^p, rounded.
//   Column (b, p) of B (b: which of the mma's two blocks) holds part p where the code is in block b and
//   zero elsewhere. So each block's sum comes out on its own, and a lane scales its two columns (parts
//   2 (t & 1) and + 1 of block t >> 1) by the block's e4m3 scale in f32.
// - Lane (g, t) brings rows g and g + 8 of a group of 16; mmas go in pairs: lanes t and t ^ 1 read the same
//   16 bytes (four words, two blocks) of a row, and lane t takes word 2 j + (t & 1) for mma j of the pair.
// - The sums: a quad's four lanes by shuffles, the warps' in warp order at the end (bitwise reproducible,
//   direct loads the same bits). They are not gemv_core's order: the loop and this path agree to f32's
//   rounding, not bit for bit.
#if MVM_E2M1_F8 && (!defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 890)   // e4m3 mma: sm_89 and later
#define MVM_IF_E2M1_F8(...) __VA_ARGS__
// Groups of 16 rows whose block scales a warp has in flight (its own ring in xs, filled by cp.async).
constexpr int F8_SCALE_GROUPS = 4;
// MVM_E2M1_F8 is the fewest rows a tile takes this path with: a call builds B's fragments and waits for its
// first scales first, which cost more than short tiles gain (H200: llama-7b-32k's q/k/v tiles ran 1.3-1.5 us
// slower, its gate/up calls of 109 rows and its LM head tiles faster; docs/quantization.md). 1: every tile.
// Tiles of at least MVM_E2M1_F8 rows of K = 2048 or 4096 (a group of 16 rows is one or two whole ring stages)
// whose B fragments (K floats) and scale ring (16 rows x K / 16 bytes a group) fit between x and the
// per-warp sums, with the warps' factors (NCW floats) above the ring: 3 K + NCW + PART_FLOATS floats of xs,
// which a build sized to its program holds for them.
__device__ __forceinline__ bool e2m1_f8_takes(const gemv_view& v, int nrows, int K) {
  return NCW == 8 && STAGE_BYTES == 16384 && (K == 2048 || K == 4096) && nrows >= MVM_E2M1_F8 &&
         nrows <= ACC_ROWS && v.xs + 2 * K + F8_SCALE_GROUPS * K / 4 + NCW <= v.part;
}
// This warp's block scales of group gi (16 rows x K / 128 bytes: its codes' blocks) into its ring slot,
// asynchronously, as one cp.async group (empty past the tile's rows): lane l copies row l / 2's half l % 2.
__device__ __forceinline__ void f8_scales_async(const gemv_view& v, unsigned char* ring, const unsigned char* bs,
                                                int gi, int nrows, int K) {
  const int r = 16 * gi + (v.lane >> 1), wb = K / 128, half = wb / 2;   // bytes: a warp's row slice, a lane's
  unsigned char* dst = ring + (gi % F8_SCALE_GROUPS) * 16 * wb + (v.lane >> 1) * wb + (v.lane & 1) * half;
  const unsigned char* src = bs + (long)r * (K / 16) + wb * v.warp + (v.lane & 1) * half;
  if (r < nrows) {
    if (half == 16) cp_async16(dst, src);
    else cp_async8(dst, src);
  }
  asm volatile("cp.async.commit_group;" ::: "memory");
}
__device__ __forceinline__ void mma_e4m3_16832(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                               uint32_t b0, uint32_t b1) {
  asm volatile("mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
               "{%8, %9}, {%10, %10, %10, %10};"
               : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
               : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1), "f"(0.f));
}
// Byte i of ev / od: the e4m3 of code 2i / 2i + 1 of u (times 2^-6).
__device__ __forceinline__ void e2m1_e4m3_words(uint32_t u, uint32_t& ev, uint32_t& od) {
  ev = ((u << 2) & 0x1c1c1c1cu) | ((u << 4) & 0x80808080u);
  od = ((u >> 2) & 0x1c1c1c1cu) | (u & 0x80808080u);
}
__device__ __forceinline__ float e4m3_value(uint32_t b) {
  return __half2float(__half(__nv_cvt_fp8_to_halfraw((__nv_fp8_storage_t)b, __NV_E4M3)));
}

// B's fragments of warp w's range into frag (128 bytes an mma, M = K / 256 mmas a warp: the two words of each
// of the 16 lanes whose column's block is their own, lane slot 2 g + (t & 1)); returns the factor the warp's
// sums take back (its power of two, and 2^6 for the codes). Lane l builds the words of (word W, half h) pairs
// l, l + 32, ...: W's codes h, h + 2, h + 4, h + 6, each part p one 32-bit word.
__device__ __forceinline__ float e2m1_f8_fragments(const gemv_view& v, int K, unsigned char* frag) {
  const int k0 = (K / NCW) * v.warp, hb = K / 8, M = K / 256;
  const uint32_t xs0 = smem_addr(v.xs);
  // x[k] in xs_split 3 (gemv_core.cuh: xs_index, with the run length hb held in a register)
  auto xat = [&](int k) { return ldsf32(xs0 + 4u * (((k >> 2) & 7) * hb + ((k >> 5) << 2) + (k & 3))); };
  // the warp's x is K / 64 consecutive floats of each of xs's eight runs (xs_split 3): read run by run, a lane
  // a bank (in code order every load was an 8-way bank conflict)
  float mx = 0.f;
  const int lr = 31 - __clz(K / 64);             // K / 64 = 2^lr floats a run (K = 2048, 4096)
#pragma unroll 2
  for (int i = v.lane; i < K / NCW; i += 32)
    mx = fmaxf(mx, fabsf(ldsf32(xs0 + 4u * ((i >> lr) * hb + k0 / 8 + (i & ((1 << lr) - 1))))));
  mx = __uint_as_float(__reduce_max_sync(0xffffffffu, __float_as_uint(mx)));   // |x| >= 0: its bits order as floats
  // 0, inf and NaN: scale 1 (inf and NaN do not survive e4m3's saturating conversion: the research knob's limit)
  const int ex = mx > 0.f && mx <= 3.0e38f ? max(-119, ilogbf(mx)) : 0;
  const float up = ldexpf(1.f, 7 - ex);
#pragma unroll 1
  for (int q = v.lane; q < 2 * (K / NCW) / 8; q += 32) {
    const int W = q >> 1, h = q & 1, u = W >> 2;
    const int t = 2 * (u & 1) + (W & 1), m = 2 * (u >> 1) + ((W >> 1) & 1);
    float r[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) r[i] = xat(k0 + 8 * W + 2 * i + h) * up;
#pragma unroll
    for (int p = 0; p < 4; ++p) {
      const uint32_t lo = __nv_cvt_float2_to_fp8x2(make_float2(r[0], r[1]), __NV_SATFINITE, __NV_E4M3);
      const uint32_t hi = __nv_cvt_float2_to_fp8x2(make_float2(r[2], r[3]), __NV_SATFINITE, __NV_E4M3);
      const int g = 4 * (u & 1) + p;
      asm volatile("st.shared.u32 [%0], %1;" ::"r"(smem_addr(frag) + (v.warp * M + m) * 128 + 8 * (2 * g + (t & 1)) + 4 * h),
                   "r"(lo | (hi << 16)) : "memory");
#pragma unroll
      for (int i = 0; i < 4; ++i) r[i] = (r[i] - e4m3_value(((i < 2 ? lo : hi) >> (8 * (i & 1))) & 0xffu)) * 16.f;
    }
  }
  __syncwarp();
  return ldexpf(1.f, ex - 1);
}

// acc[r] = row r . x times its row scale rsc[r] (the call is gemv_packed's last, as gemv_xreg's). same_x: the
// task's last GEMV took this path on the same x (RMS_GLU's up after gate), so B's fragments and each warp's
// factor are still in xs: not built again. gsrc: the
// stream's first byte (direct loads); bs: the tile's block scales, row r's at bs + r K/16. A group of 16 rows
// is K / 2048 ring stages, waited for together and handed back together; a warp takes its 8 K / 2048 mmas
// of a group in chunks of 8 (four pairs). Its block scales come through its own ring in xs, filled
// F8_SCALE_GROUPS - 1 groups ahead by cp.async. Rows past the tile's are read through the ring too (what
// the ring holds there) and their sums dropped; direct loads read the tile's last row in their place.
template <bool DIRECT>
__device__ __forceinline__ int2 gemv_e2m1_f8_t(gemv_view v, const unsigned char* gsrc, int nrows, int K, float* acc,
                                               const unsigned char* bs, const float* rsc, bool same_x) {
  const int G = K / 2048, M = K / 256;           // ring stages (and chunks) a group; mmas a warp a group
  unsigned char* frag = reinterpret_cast<unsigned char*>(v.xs + K);
  unsigned char* const sring = reinterpret_cast<unsigned char*>(v.xs + 2 * K) + v.warp * F8_SCALE_GROUPS * K / 8;
  volatile float* const backs = v.xs + 2 * K + F8_SCALE_GROUPS * K / 4;   // each warp's factor, above the rings
  for (int gi = 0; gi < F8_SCALE_GROUPS - 1; ++gi) f8_scales_async(v, sring, bs, gi, nrows, K);   // under the build
  float back;
  if (same_x) {
    back = backs[v.warp];
  } else {
    back = e2m1_f8_fragments(v, K, frag);
    if (v.lane == 0) backs[v.warp] = back;
  }
  const int g = v.lane >> 2, t = v.lane & 3, rowb = K / 2;
  const uint32_t bmask = (t >> 1) == (g >> 2) ? 0xffffffffu : 0u;   // lanes whose column's block is not theirs: 0
  const uint32_t f0 = smem_addr(frag) + v.warp * M * 128 + 8 * (2 * g + (t & 1));
  // lane t's 16 bytes of a row for mma pair j: byte 16 (u0 + 2 j) of the row
  const int u0 = (K / NCW / 32) * v.warp + (t >> 1);
  float* const part = v.part + v.warp * ACC_ROWS;
  const uint32_t ring0 = smem_addr(v.ring);
  const int ngroups = (nrows + 15) / 16, nst = (nrows * rowb + STAGE_BYTES - 1) / STAGE_BYTES;
  for (int gi = 0; gi < ngroups; ++gi) {
    f8_scales_async(v, sring, bs, gi + F8_SCALE_GROUPS - 1, nrows, K);   // into the slot group gi - 1 used
    const int r0 = 16 * gi, ns = min(G, nst - G * gi);   // this group's stages (the tile's last may be short)
    // rows g and g + 8 of the group: a row's K / 2 bytes lie in one stage (16 KiB holds 16384 / rowb whole rows)
    uint32_t pa, pb;
    if constexpr (DIRECT) {
      pa = 0; pb = 0;
    } else {
      const int oa = g * rowb, ob = oa + 8 * rowb;
      pa = ring0 + ((v.stage + oa / STAGE_BYTES) % STAGES) * STAGE_BYTES + oa % STAGE_BYTES + 16 * u0;
      pb = ring0 + ((v.stage + ob / STAGE_BYTES) % STAGES) * STAGE_BYTES + ob % STAGE_BYTES + 16 * u0;
      for (int i = 0; i < ns; ++i) {
        const int s = v.stage + i;
        while (!mbar_try_wait(v.full0 + 8 * (s % STAGES), v.phase ^ (s >= STAGES ? 1u : 0u))) {}
      }
    }
    const uint4* ga = reinterpret_cast<const uint4*>(gsrc + (long)min(r0 + g, nrows - 1) * rowb) + u0;
    const uint4* gb = reinterpret_cast<const uint4*>(gsrc + (long)min(r0 + g + 8, nrows - 1) * rowb) + u0;
    asm volatile("cp.async.wait_group %0;" ::"n"(F8_SCALE_GROUPS - 1) : "memory");   // group gi's have landed
    __syncwarp();
    // lane (g, t)'s scale pair of pair jj: bytes 4 jj + 2 (t >> 1) of rows g and g + 8 of the warp's slice
    const uint32_t sg = smem_addr(sring + (gi % F8_SCALE_GROUPS) * (K / 8) + g * (K / 128) + 2 * (t >> 1));
    float ag = 0.f, ah = 0.f;
#pragma unroll 1
    for (int c = 0; c < G; ++c) {
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int jj = 4 * c + j;
        uint4 wa, wb;
        if constexpr (DIRECT) {
          wa = __ldcs(ga + 2 * jj);
          wb = __ldcs(gb + 2 * jj);
        } else {
          wa = lds128(pa + 32 * jj);
          wb = lds128(pb + 32 * jj);
        }
        uint32_t sa, sb;
        asm volatile("ld.shared.u16 %0, [%1];" : "=r"(sa) : "r"(sg + 4 * jj));
        asm volatile("ld.shared.u16 %0, [%1];" : "=r"(sb) : "r"(sg + 8 * (K / 128) + 4 * jj));
        const float2 fa = __half22float2(__half2(__nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)sa, __NV_E4M3)));
        const float2 fb = __half22float2(__half2(__nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)sb, __NV_E4M3)));
#pragma unroll
        for (int q = 0; q < 2; ++q) {            // mma 2 jj + q: word 2 q + (t & 1) of the 16 bytes
          const uint32_t ua = (t & 1) ? (q ? wa.w : wa.y) : (q ? wa.z : wa.x);
          const uint32_t ub = (t & 1) ? (q ? wb.w : wb.y) : (q ? wb.z : wb.x);
          uint32_t a0, a1, a2, a3, b0, b1;
          asm volatile("ld.shared.v2.u32 {%0, %1}, [%2];" : "=r"(b0), "=r"(b1) : "r"(f0 + 128 * (2 * jj + q)));
          e2m1_e4m3_words(ua, a0, a2);
          e2m1_e4m3_words(ub, a1, a3);
          float d[4];
          mma_e4m3_16832(d, a0, a1, a2, a3, b0 & bmask, b1 & bmask);
          ag = fmaf(q ? fa.y : fa.x, fmaf(d[1], 0.0625f, d[0]), ag);
          ah = fmaf(q ? fb.y : fb.x, fmaf(d[3], 0.0625f, d[2]), ah);
        }
      }
    }
    if (t & 1) { ag *= 1.f / 256.f; ah *= 1.f / 256.f; }   // parts 2 and 3 were taken times 16^2
    ag += __shfl_xor_sync(0xffffffffu, ag, 1); ag += __shfl_xor_sync(0xffffffffu, ag, 2);
    ah += __shfl_xor_sync(0xffffffffu, ah, 1); ah += __shfl_xor_sync(0xffffffffu, ah, 2);
    if (t == 0) {
      if (r0 + g < nrows) part[r0 + g] = ag * back;
      if (r0 + g + 8 < nrows) part[r0 + g + 8] = ah * back;
    }
    if constexpr (!DIRECT)
      for (int i = 0; i < ns; ++i) release_stage(v);
  }
  consumer_sync();
  for (int r = v.warp * 32 + v.lane; r < nrows; r += NCT) acc[r] = warp_order_sum(v, r) * __ldg(rsc + r);
  consumer_sync();
  return make_int2(v.stage, (int)v.phase);
}
__device__ __noinline__ int2 gemv_e2m1_f8(gemv_view v, const unsigned char* gsrc, int nrows, int K, float* acc,
                                          const unsigned char* bs, const float* rsc, bool same_x) {
  return v.direct ? gemv_e2m1_f8_t<true>(v, gsrc, nrows, K, acc, bs, rsc, same_x)
                  : gemv_e2m1_f8_t<false>(v, gsrc, nrows, K, acc, bs, rsc, same_x);
}
#else
#define MVM_IF_E2M1_F8(...)
#endif
