// Probe (standalone, runs on a GPU): how fast one SM multiplies NVFP4 rows by x with the codes already in
// shared memory (what a landed ring stage costs the consumers, without the stream), and how exactly.
// Each block holds 16 rows; 8 warps; clock64 over 200 passes; errors against f64 on the host.
//
//  loop:  gemv_core's row-per-warp loop as the megakernel runs it on rows it cannot hold x for
//         (llama-7b-32k's K = 4096 and 14336): warp w takes rows w, w + 8; a lane's 32-code piece meets its
//         32 activations through eight 16-byte shared-memory loads (xs in eight runs of K/8), codes k and
//         k + 4 of a word as one f16x2 (code x 2^-14), converted to f32 and FMA'd; the piece's two e4m3
//         block scales one 16-bit word.
//  f16x:  the loop on x rounded to f16 (the error any form with f16 activations starts from).
//  mma:   mma.sync.m16n8k32 on e4m3. An e2m1 code's bits shifted left by two are the e4m3 bits of the code
//         times 2^-6, exactly (e2m1's subnormal 0.5 lands on e4m3's subnormals), so a word of 8 codes
//         decodes into two 4-code A registers with two shifts and two LOP3s. (sm_90 has no e4m3 mma.sync:
//         ptxas turns each into f16 unpacks of A and B and two f16 HMMAs, which these numbers include.) x goes in
//         B as four e4m3 parts (p0 = e4m3(x), p1 = e4m3(x - p0), ...; x scaled per warp by a power of two).
//         B's eight columns are (block b of the mma's two, part p): column (b, p) holds part p of x where
//         the code is in block b and zero elsewhere, so each block's sum comes out on its own and is scaled
//         in f32 by its e4m3 block scale after the mma. Warp w owns codes [w K/8, (w + 1) K/8) of every
//         row, its B registers held for the whole run; lane (g, t) brings rows g and g + 8, word t of each
//         32-code group (lanes t and t ^ 1 share a block). Fully unrolled.
//  mmasp: as mma, each part stored times 2^(4p) (the rest times 16 before it is rounded), its column scaled
//         back in f32: no part falls to e4m3's subnormals.
//  mmaxq: mma on x already e4m3 (only p0 nonzero), against f64 of that x: the tensor core's own sums.
//  mmas:  mmasp with B's fragments in shared memory (16 lanes' two words an mma) and the loop rolled by 4.
//  mma16: mma.sync.m16n8k16 on f16, one block a k-step, x's hi and lo f16 parts in columns 0 and 1.
//         (mmas and mma16, slower than the loop at every K past 4096, are in this file as of 9793f5b only.)
//  mmacN: mmasp for any K: B's fragments from shared memory into registers N mmas at a time (the same code
//         at every K), A's words loaded 16 bytes at once (lanes t and t ^ 1 read the same two blocks and
//         serve a pair of mmas), the scale bytes of a pair in one 16-bit load.
//  xreg:  gemv_xreg's K = 2048 form (a lane holds its two pieces' 64 activations in registers).
//
//   nvcc -std=c++17 -O3 -gencode arch=compute_90a,code=sm_90a -o /tmp/e4m3_mma bench/probes/e4m3_mma_gemv.cu
//   /tmp/e4m3_mma [K]      # cycles per 16 KiB of codes per SM for each form, and each form's error
//
// H200, 2026-11-29 (bench/results/probe/2026-11-29-*-e4m3-mma-gemv*.json; the last, -all-forms, is this file's
// code as committed, every form within 1% of the numbers below), cycles per 16 KiB per SM, rms relative error:
//   K       loop         f16x         mma          mmasp        mmaxq        mmas         mma16
//   2048    2155 1.0e-7  2155 2.1e-4  1234 4.0e-5  1224 3.6e-7  1235 6.6e-8  2221 3.6e-7  2082 1.0e-7
//   4096    1855 1.1e-7  1855 2.3e-4  1174 5.2e-5  1184 3.2e-7  1175 7.4e-8  2171 3.2e-7  2072 1.4e-7
//   8192    1710 1.1e-7  1709 2.0e-4  2064 6.8e-5  2064 3.3e-7  2064 7.8e-8  2151 3.3e-7  4104 1.6e-7
//   14336   1650 1.3e-7  1650 1.9e-4  2059 5.6e-5  2058 3.4e-7  2058 9.3e-8  2142 3.4e-7  4104 2.1e-7
//   and, in later runs of the same tree (the columns above unchanged to the cycle):
//   K       mmac8        mmac16       xreg
//   2048    1144 3.6e-7  1152 3.6e-7  1701 1.0e-7
//   4096    1335 3.2e-7  1221 3.2e-7
//   8192    1293 3.2e-7  1285 3.2e-7
//   14336   1278 3.5e-7  1278 3.5e-7
// The tensor core sums these products exactly enough (mmaxq); the first form's 5e-5 was its parts sinking
// under e4m3's smallest step, which the scaled parts cure. At K <= 4096 (16 mmas a warp) the scaled-part
// form takes 0.55-0.64 of the loop's cycles; at 32 and 56 mmas a warp, unrolled or rolled, it is slower than
// the loop. The chunked form (mmac) holds 0.53-0.77 of the loop's cycles at every K, and 0.67 of xreg's at
// K = 2048, with f32-like error. Row g's and g + 8's words sit K/2 bytes apart, a multiple of 128: the A
// loads are 8-way bank conflicts in every form here (mmac's 16-byte loads issue a quarter as many).
// mmacwN (probe/2026-11-29-9ffaa2f-wgmma-e2m1-gemv.json) is mmacN with the rows' units swizzled (no conflict) and
// a chunk's scale bytes in 16-byte loads: 1351 / 1350 at K = 2048, 1344 / 1300 at 4096, slower than mmac's
// 1167 / 1222 in the same call. mma.sync here is bound by what ptxas adds for it, not by the loads (wgmma,
// bench/probes/wgmma_e2m1_gemv.cu, gains from the same two changes).
#include "nvfp4_gemv_forms.cuh"

// ---- mma form ----
__device__ __forceinline__ void mma_e4m3(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                         uint32_t b0, uint32_t b1) {
  asm volatile("mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
               "{%8, %9}, {%10, %10, %10, %10};"
               : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
               : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1), "f"(0.f));
}
// SP: each part p stored times 2^(4p) (what the parts before it left, times 16, rounded to e4m3), so that no part
// falls to e4m3's subnormals; column (b, p)'s sum is scaled back by 2^(-4p) in f32. Without it (the first
// form) the parts of small activations sink under e4m3's smallest step, 2^-9, and the sums carry about
// 5e-5 of error; with it the error is that of f32 (the measured table in the README of bench/probes).
template <int KW, bool SP = false>   // codes a warp owns of each row: K / 8
__global__ void __launch_bounds__(NT, 1) gemv_mma(const uint8_t* codes, const uint8_t* scales, const float* x,
                                                  float* y, int reps, long long* cycles) {
  constexpr int K = 8 * KW, M = KW / 32, rb = K / 2;               // M: mmas a warp a row group
  extern __shared__ __align__(16) unsigned char sm[];
  float* part = reinterpret_cast<float*>(sm);                      // NW x ROWS warp sums
  unsigned char* ws = sm + 4 * NW * ROWS;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane >> 2, t = lane & 3;
  load_block(ws, codes, K);
  // B: this warp's codes [KW w, KW (w + 1)); column g is (block g >> 2 of each mma's two, part g & 3)
  const int k0 = KW * warp, ex = warp_exp(x, k0, KW, lane);      // max |x| 2^-e scaled into [128, 256)
  const float up = ldexpf(1.f, 7 - ex), back = ldexpf(1.f, ex - 7 + 6);   // and 2^6 for the codes' 2^-6
  uint32_t bf[M][2];
  const bool act = (t >> 1) == (g >> 2);
#pragma unroll
  for (int m = 0; m < M; ++m) {
    // lane t's word of the group is word 4m + t of the warp's range: block (4m + t) / 2, the mma's block t / 2
    b_words(x + k0 + 8 * (4 * m + t), up, g & 3, SP, bf[m]);
    if (!act) bf[m][0] = bf[m][1] = 0u;
  }
  __syncthreads();
  const long long t0 = clock64();
  const uint32_t ws0 = saddr(ws) + 4u * (k0 / 8 + t);
  const uint8_t* sg0 = scales + ((long)blockIdx.x * ROWS + g) * (K / 16) + k0 / 16 + (t >> 1);
  const uint8_t* sh0 = sg0 + 8 * (K / 16);
  for (int it = 0; it < reps; ++it) {
    float ag = 0.f, ah = 0.f;
    const int z = opaque0();
    const uint8_t *sg = sg0 + z, *sh = sh0 + z;
    uint32_t cg = __ldg(sg), ch = __ldg(sh);
#pragma unroll
    for (int m = 0; m < M; ++m) {
      const uint32_t ng = m + 1 < M ? __ldg(sg + 2 * (m + 1)) : 0u, nh = m + 1 < M ? __ldg(sh + 2 * (m + 1)) : 0u;
      const uint32_t ug = lds32(ws0 + g * rb + 16 * m), uh = lds32(ws0 + (g + 8) * rb + 16 * m);
      uint32_t a0, a1, a2, a3;
      e2m1_to_e4m3(ug, a0, a2);
      e2m1_to_e4m3(uh, a1, a3);
      float d[4];
      mma_e4m3(d, a0, a1, a2, a3, bf[m][0], bf[m][1]);
      if (SP) {                                  // lane t holds parts 2 (t & 1) and 2 (t & 1) + 1
        ag = fmaf(e4m3f(cg), fmaf(d[1], 0.0625f, d[0]), ag);
        ah = fmaf(e4m3f(ch), fmaf(d[3], 0.0625f, d[2]), ah);
      } else {
        ag = fmaf(e4m3f(cg), d[0] + d[1], ag);
        ah = fmaf(e4m3f(ch), d[2] + d[3], ah);
      }
      cg = ng; ch = nh;
    }
    if (SP && (t & 1)) { ag *= 1.f / 256.f; ah *= 1.f / 256.f; }
    ag = quad_sum(ag); ah = quad_sum(ah);
    if (t == 0 && it == reps - 1) { part[warp * ROWS + g] = ag * back; part[warp * ROWS + g + 8] = ah * back; }
  }
  finish(part, y, t0, cycles);
}

// B's fragments of this warp's codes [KW w, KW (w + 1)) in scaled parts into bsm (each active lane's two words
// of an mma, 128 bytes an mma: 16 lanes), lane t's word of mma m being word_of(m) of the range. Returns the
// factor the warp's sums take back (its power of two and the codes' 2^-6).
template <typename F>
__device__ float b_to_shared(unsigned char* bsm, const float* x, int KW, F word_of) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane >> 2, t = lane & 3, M = KW / 32;
  const int k0 = KW * warp, ex = warp_exp(x, k0, KW, lane);
  const float up = ldexpf(1.f, 7 - ex);
  for (int m = 0; m < M; ++m) {
    uint32_t bw[2];
    b_words(x + k0 + 8 * word_of(m), up, g & 3, true, bw);
    if ((t >> 1) == (g >> 2)) *reinterpret_cast<uint2*>(bsm + (warp * M + m) * 128 + 8 * (2 * g + (t & 1))) = make_uint2(bw[0], bw[1]);
  }
  return ldexpf(1.f, ex - 7 + 6);
}

// ---- mmac: mmasp for any K, B's fragments from shared memory into registers a chunk of CH mmas at a time
// (code the same size at every K), and A's words loaded 16 bytes at once: lanes t and t ^ 1 read the same four
// words (two blocks), lane t using word 2 j + (t & 1) of them at mma j of the pair of mmas they serve.
// SW: the rows' 16-byte units stored swizzled (unit index XOR row & 7: the eight rows of a warp's 16-byte load on
// different banks, not K / 2 bytes apart on the same ones) and a chunk's scale bytes of a row in 16-byte loads.
template <int KW, int CH, bool SW = false>
__global__ void __launch_bounds__(NT, 1) gemv_mmac(const uint8_t* codes, const uint8_t* scales, const float* x,
                                                   float* y, int reps, long long* cycles) {
  constexpr int K = 8 * KW, M = KW / 32, rb = K / 2;
  static_assert(M % CH == 0 && CH % 2 == 0, "chunks of whole mma pairs");
  extern __shared__ __align__(16) unsigned char sm[];
  float* part = reinterpret_cast<float*>(sm);
  unsigned char* bsm = sm + 4 * NW * ROWS;
  unsigned char* ws = bsm + NW * M * 128;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane >> 2, t = lane & 3;
  load_block(ws, codes, K);
  if (SW) {                                        // swizzle each row's units in place, a row per warp
    __syncthreads();
    for (int r = warp; r < ROWS; r += NW)
      for (int u0 = 0; u0 < K / 32; u0 += 32) {
        const uint4 v = reinterpret_cast<uint4*>(ws + r * (K / 2))[u0 + lane];
        __syncwarp();
        reinterpret_cast<uint4*>(ws + r * (K / 2))[u0 + (lane ^ (r & 7))] = v;
        __syncwarp();
      }
  }
  const int k0 = KW * warp;
  // mma m (pair m / 2, j = m % 2): lane t's word is word 4 (2 (m / 2) + (t >> 1)) + 2 j + (t & 1) of the warp's range:
  // the pair's 16-byte unit 2 (m / 2) + (t >> 1), which both t and t ^ 1 load
  auto word_of = [&](int m) { return 4 * (2 * (m >> 1) + (t >> 1)) + 2 * (m & 1) + (t & 1); };
  const float back = b_to_shared(bsm, x, KW, word_of);
  const bool act = (t >> 1) == (g >> 2);
  const int slot = 2 * g + (t & 1);
  __syncthreads();
  const long long t0 = clock64();
  const uint32_t wsb = saddr(ws) + g * rb, b0a = saddr(bsm) + warp * M * 128 + 8 * slot;
  const uint32_t msk = act ? 0xffffffffu : 0u;
  for (int it = 0; it < reps; ++it) {
    float ag = 0.f, ah = 0.f;
    const int z = opaque0();
    // scale byte of mma m for lane t: block of word_of(m) = 2 (2 (m / 2) + (t >> 1)) + (m & 1)... as k0 / 16 + that
    const uint8_t* sg = scales + ((long)blockIdx.x * ROWS + g) * (K / 16) + k0 / 16 + 2 * (t >> 1) + z;
    const uint8_t* sh = sg + 8 * (K / 16);
    for (int c = 0; c < M; c += CH) {
      uint32_t sv[CH / 2][2];                    // SW: the chunk's pairs' scale words of rows g and g + 8
      if (SW) {
        const uint8_t* pg = scales + ((long)blockIdx.x * ROWS + g) * (K / 16) + k0 / 16 + 2 * c + z;
#pragma unroll
        for (int v = 0; v < CH / 8; ++v) {
          const uint4 a = __ldg(reinterpret_cast<const uint4*>(pg) + v), b = __ldg(reinterpret_cast<const uint4*>(pg + 8 * (K / 16)) + v);
          sv[4 * v][0] = a.x; sv[4 * v + 1][0] = a.y; sv[4 * v + 2][0] = a.z; sv[4 * v + 3][0] = a.w;
          sv[4 * v][1] = b.x; sv[4 * v + 1][1] = b.y; sv[4 * v + 2][1] = b.z; sv[4 * v + 3][1] = b.w;
        }
      }
      uint32_t bq[CH][2];
#pragma unroll
      for (int j = 0; j < CH; ++j) {
        uint2 bb;
        asm volatile("ld.shared.v2.u32 {%0, %1}, [%2];" : "=r"(bb.x), "=r"(bb.y) : "r"(b0a + 128 * (c + j)));
        bq[j][0] = bb.x & msk; bq[j][1] = bb.y & msk;
      }
#pragma unroll
      for (int j = 0; j < CH; j += 2) {
        const int m = c + j;
        // unit U = k0 / 32 + m + (t >> 1) of rows g and g + 8 (m even); SW: stored at U ^ g
        const uint32_t uo = SW ? 16u * (((k0 / 32 + m) & ~7) + (((m & 7) | (t >> 1)) ^ g)) : 16u * (k0 / 32 + (t >> 1)) + 16u * m;
        const uint4 ug = lds128(wsb + uo), uh = lds128(wsb + 8 * rb + uo);
        const uint32_t sgw = SW ? sv[j / 2][0] >> (16 * (t >> 1)) : __ldg(reinterpret_cast<const uint16_t*>(sg + 4 * (m >> 1)));
        const uint32_t shw = SW ? sv[j / 2][1] >> (16 * (t >> 1)) : __ldg(reinterpret_cast<const uint16_t*>(sh + 4 * (m >> 1)));
#pragma unroll
        for (int q = 0; q < 2; ++q) {           // mma m + q: words 2q + (t & 1) of the unit
          const uint32_t wg = (t & 1) ? (q ? ug.w : ug.y) : (q ? ug.z : ug.x);
          const uint32_t wh = (t & 1) ? (q ? uh.w : uh.y) : (q ? uh.z : uh.x);
          uint32_t a0, a1, a2, a3;
          e2m1_to_e4m3(wg, a0, a2);
          e2m1_to_e4m3(wh, a1, a3);
          float d[4];
          mma_e4m3(d, a0, a1, a2, a3, bq[j + q][0], bq[j + q][1]);
          ag = fmaf(e4m3f((sgw >> (8 * q)) & 0xff), fmaf(d[1], 0.0625f, d[0]), ag);
          ah = fmaf(e4m3f((shw >> (8 * q)) & 0xff), fmaf(d[3], 0.0625f, d[2]), ah);
        }
      }
    }
    if (t & 1) { ag *= 1.f / 256.f; ah *= 1.f / 256.f; }
    ag = quad_sum(ag); ah = quad_sum(ah);
    if (t == 0 && it == reps - 1) { part[warp * ROWS + g] = ag * back; part[warp * ROWS + g + 8] = ah * back; }
  }
  finish(part, y, t0, cycles);
}

template <int KW>
static void run(int sms, int reps) {
  constexpr int K = 8 * KW;
  const int R = sms * ROWS;
  std::mt19937 rng(1234);
  std::vector<uint8_t> codes((size_t)R * K / 2), scales((size_t)R * K / 16);
  std::vector<float> x(K);
  random_nvfp4(rng, codes, scales, x);
  const std::vector<double> ref = reference(codes, scales, x, R, K);
  uint8_t *dc, *ds; float *dx, *dy; long long* dcy;
  cudaMalloc(&dc, codes.size()); cudaMalloc(&ds, scales.size()); cudaMalloc(&dx, 4 * K);
  cudaMalloc(&dy, 4 * R); cudaMalloc(&dcy, 8 * sms);
  cudaMemcpy(dc, codes.data(), codes.size(), cudaMemcpyHostToDevice);
  cudaMemcpy(ds, scales.data(), scales.size(), cudaMemcpyHostToDevice);
  cudaMemcpy(dx, x.data(), 4 * K, cudaMemcpyHostToDevice);
  std::vector<float> y(R);
  std::vector<float> xh(K);                     // x rounded to f16: the error an f16-activation form starts from
  for (int i = 0; i < K; ++i) xh[i] = __half2float(__float2half_rn(x[i]));
  float* dxh = upload(xh);
  // x rounded to e4m3 (within 2^-1..2^7 after the probe's scaling, none subnormal): the mma form's B is then exact,
  // so its error is the tensor core's sums alone
  std::vector<float> xq(K);
  for (int i = 0; i < K; ++i) xq[i] = float(__nv_fp8_e4m3(x[i]));
  const std::vector<double> refq = reference(codes, scales, xq, R, K);
  float* dxq = upload(xq);
  const char* names[12] = {"loop", "mma", "f16x", "mma16", "mmasp", "mmaxq", "mmas", "mmac8", "mmac16", "xreg",
                           "mmacw8", "mmacw16"};
  // mma16 (3) and mmas (6) are in this file as of 9793f5b, not after it
  for (int form = 0; form < 12; ++form) {
    if ((form == 9 && K != 2048) || form == 3 || form == 6) continue;
    const size_t shm = form == 0 || form == 2 || form == 9 ? 4 * K + ROWS * K / 2 : 4 * NW * ROWS + ROWS * K / 2 + (form >= 6 ? 4 * K : 0);
    if (form == 9) cudaFuncSetAttribute(gemv_xreg2048, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)shm);
    if (form == 7) cudaFuncSetAttribute(gemv_mmac<KW, 8>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)shm);
    if (form == 8) cudaFuncSetAttribute(gemv_mmac<KW, (KW / 32) % 16 ? 8 : 16>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)shm);
    if (form == 10) cudaFuncSetAttribute(gemv_mmac<KW, 8, true>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)shm);
    if (form == 11) cudaFuncSetAttribute(gemv_mmac<KW, (KW / 32) % 16 ? 8 : 16, true>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)shm);
    if (form == 0 || form == 2) cudaFuncSetAttribute(gemv_loop, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)shm);
    else if (form == 1 || form == 5) cudaFuncSetAttribute(gemv_mma<KW>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)shm);
    else if (form == 4) cudaFuncSetAttribute(gemv_mma<KW, true>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)shm);
    const double best = best_cycles([&] {
      if (form == 0 || form == 2) gemv_loop<<<sms, NT, shm>>>(dc, ds, form == 2 ? dxh : dx, dy, K, reps, dcy);
      else if (form == 1 || form == 5) gemv_mma<KW><<<sms, NT, shm>>>(dc, ds, form == 5 ? dxq : dx, dy, reps, dcy);
      else if (form == 4) gemv_mma<KW, true><<<sms, NT, shm>>>(dc, ds, dx, dy, reps, dcy);
      else if (form == 9) gemv_xreg2048<<<sms, NT, shm>>>(dc, ds, dx, dy, K, reps, dcy);
      else if (form == 7) gemv_mmac<KW, 8><<<sms, NT, shm>>>(dc, ds, dx, dy, reps, dcy);
      else if (form == 8) gemv_mmac<KW, (KW / 32) % 16 ? 8 : 16><<<sms, NT, shm>>>(dc, ds, dx, dy, reps, dcy);
      else if (form == 10) gemv_mmac<KW, 8, true><<<sms, NT, shm>>>(dc, ds, dx, dy, reps, dcy);
      else gemv_mmac<KW, (KW / 32) % 16 ? 8 : 16, true><<<sms, NT, shm>>>(dc, ds, dx, dy, reps, dcy);
    }, dcy, sms);
    cudaMemcpy(y.data(), dy, 4 * R, cudaMemcpyDeviceToHost);
    const Errors er = errors(y, form == 5 ? refq : ref);
    const double per16k = best / reps / (ROWS * K / 2 / 16384.0);
    printf("K %5d  %-4s  %8.1f cycles per 16 KiB per SM   max err %.3e of max |y|, rms rel err %.3e\n", K,
           names[form], per16k, er.max_rel, er.rms_rel);
  }
  cudaFree(dxq); cudaFree(dxh); cudaFree(dc); cudaFree(ds); cudaFree(dx); cudaFree(dy); cudaFree(dcy);
}

int main(int argc, char** argv) {
  int sms = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  const int which = argc > 1 ? atoi(argv[1]) : 0, reps = 200;
  if (!which || which == 2048) run<256>(sms, reps);
  if (!which || which == 4096) run<512>(sms, reps);
  if (!which || which == 8192) run<1024>(sms, reps);
  if (!which || which == 14336) run<1792>(sms, reps);
  return 0;
}
