// Probe (standalone, runs on a GPU): NVFP4 rows times x on Hopper's native FP8 path, wgmma, with the codes
// already in shared memory (what a landed ring stage costs the consumers, without the stream), and how exactly.
//
// e4m3_mma_gemv.cu found that mma.sync on e4m3 is no FP8 instruction on sm_90: ptxas lowers each one to f16
// unpacks of A and B and two f16 HMMAs. wgmma.m64n8k32 on e4m3 is. This form keeps that probe's arithmetic:
//  - A from registers: an e2m1 code's bits shifted left by two are the e4m3 bits of the code times 2^-6, so a
//    word of 8 codes is two A registers after two shifts and two LOP3s. A warpgroup's warp w brings rows
//    16 w .. 16 w + 15 in mma.sync's m16n8k32 A layout; lanes t and t ^ 1 share one 16-byte load of a row
//    (mmac's word order: lane t takes word 2 j + (t & 1) of unit t >> 1 at step j of a pair of steps).
//  - B from shared memory (K-major, no swizzle: two 8 x 16-byte core matrices a step, 256 bytes): column
//    (b, p) holds x's part p (each part scaled by 16^p, x by a power of two a warpgroup) where the code is in
//    block b of the step's two, zero elsewhere; built once a call (its cycles are reported apart).
//  - a step's block sums come out apart and are scaled by their e4m3 block scales in f32. Every step starts
//    a fresh accumulator (scale-d = 0), so the steps go in batches of NB wgmmas with their own registers,
//    two batches in flight: the next one is decoded and issued before the last one's sums are read.
// The block holds 64 rows (one wgmma's M); its WG warpgroups split K, and their sums are added in order.
//
//   nvcc -std=c++17 -O3 -gencode arch=compute_90a,code=sm_90a -o /tmp/wgmma_e2m1 bench/probes/wgmma_e2m1_gemv.cu
//   /tmp/wgmma_e2m1        # cycles per 16 KiB of codes per SM for each form, B's build, each form's error
//
// H200, 2026-11-29 (bench/results/probe/2026-11-29-9ffaa2f-wgmma-e2m1-gemv.json), cycles per 16 KiB of codes per SM,
// B's build in cycles, rms relative error against f64 (e4m3_mma_gemv.cu's forms in the same call: loop 2149 / 1843,
// xreg 1688 at K = 2048, mmac 1167 / 1222, all about 3.6e-7 but the loop's 1e-7):
//   K     WG NB swz scv   cycles  B build  error
//   2048   2  8  0   0    1115     2759   3.3e-5
//   2048   2  8  1   0     961     2742   3.3e-5
//   2048   2  8  0   1     909     2771   3.3e-5
//   2048   2  8  1   1     842     2790   3.3e-5
//   2048   2  4  1   1     826     2769   3.3e-5   (x already e4m3, xq: 3.0e-5)
//   2048   4  4  1   1     879     2124   3.3e-5
//   4096   2  8  0   0    1164     5008   3.4e-5
//   4096   2  8  1   1     872     4934   3.4e-5
//   4096   4  4  1   1     799     4156   3.4e-5   (xq: 3.3e-5)
// - Without the swizzle and the batched scale loads wgmma is no faster than mma.sync (1115-1164 cycles): the
//   loads bound both there. A warp's 16-byte loads of eight rows K / 2 bytes apart meet the same banks, eight
//   wavefronts for 256 bytes, and its 16-bit scale loads meet eight lines each. With both mended wgmma takes
//   0.65-0.72 of mma.sync's cycles (e4m3_mma_gemv's mmacw: the same two changes made mma.sync slower, 1300-1350,
//   since its own bound is the unpacks ptxas adds).
// - Its sums are not f32's: 3.3e-5 rms even on x that is already e4m3 (xq), where every product is exact. So the
//   tensor core's FP8 accumulation keeps about 14 bits, and x's last two parts buy nothing. That is 6x under x in
//   f16 (2.1e-4), which missed the eager model's tolerance on llama-7b-32k, and 100x over mma.sync's.
// - For the kernel: a wgmma takes 64 rows, 4 to 8 ring stages of rows of K = 2048 to 4096, so every stage of a
//   group would have to land before its first wgmma; a ring of 64-row k-chunks needs another weight layout.
#include "nvfp4_gemv_forms.cuh"

constexpr int WROWS = 64;                        // rows a block holds: one wgmma's M

// B's shared-memory descriptor: K-major, no swizzle; the step's two core matrices (k 0-15, 16-31) 128 bytes
// apart (given as both the leading and the stride offset: with N = 8 only the k one is used).
__device__ __forceinline__ uint64_t b_desc(uint32_t a) {
  return (uint64_t)((a >> 4) & 0x3fffu) | ((uint64_t)(128 >> 4) << 16) | ((uint64_t)(128 >> 4) << 32);
}
__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wg_wait() { asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory"); }
// Registers the compiler must not read or reuse across a wgmma still in flight.
__device__ __forceinline__ void keep(float& r) { asm volatile("" : "+f"(r)::"memory"); }
__device__ __forceinline__ void keep(uint32_t& r) { asm volatile("" : "+r"(r)::"memory"); }
// d = A B (scale-d false: the accumulator's old value is not read)
__device__ __forceinline__ void wgmma_e4m3(float (&d)[4], const uint32_t (&a)[4], uint64_t desc) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %9, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n8k32.f32.e4m3.e4m3 {%0, %1, %2, %3}, {%4, %5, %6, %7}, %8, p, 1, 1;\n}\n"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(0));
}

// B of a warpgroup's KG codes (x from xg) into bsm, 256 bytes a step; returns what its sums take back (the
// warpgroup's power of two and the codes' 2^-6). Step s = 2 P + j, byte (c, n, i): mma k = 16 c + i, whose
// code is 64 P + 32 u + 8 (2 j + (t' & 1)) + 2 (i & 3) + c with t' = i / 4 and u = t' >> 1 (the A layout
// above); column n = (b, p) = (n / 4, n % 4) is nonzero where u == b. A thread takes (s, c, t'): its four
// codes' four parts are the words of rows 4 u + p, and the other block's four rows are zero.
__device__ float build_b(unsigned char* bsm, const float* xg, int KG) {
  const int tid = threadIdx.x % 128, lane = threadIdx.x % 32;
  const int ex = warp_exp(xg, 0, KG, lane);
  const float up = ldexpf(1.f, 7 - ex);
  uint32_t* bw = reinterpret_cast<uint32_t*>(bsm);
  for (int it = tid; it < KG / 4; it += 128) {   // KG / 32 steps x 2 core matrices x 4 words a row
    const int s = it >> 3, c = (it >> 2) & 1, tq = it & 3, u = tq >> 1, P = s >> 1, j = s & 1;
    const int code0 = 64 * P + 32 * u + 8 * (2 * j + (tq & 1)) + c;
    float r[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) r[e] = xg[code0 + 2 * e] * up;
    uint32_t* row = bw + 64 * s + 32 * c + tq;   // word tq of row n: + 4 n
#pragma unroll
    for (int p = 0; p < 4; ++p) {
      uint32_t w = 0u;
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const __nv_fp8_storage_t q = __nv_cvt_float_to_fp8(r[e], __NV_SATFINITE, __NV_E4M3);
        w |= (uint32_t)q << (8 * e);
        r[e] = (r[e] - e4m3f(q)) * 16.f;
      }
      row[4 * (4 * u + p)] = w;
      row[4 * (4 * (1 - u) + p)] = 0u;
    }
  }
  return ldexpf(1.f, ex - 7 + 6);
}

// SWZ: each row's 16-byte units stored with their index's low three bits XORed with the row's (r & 7), so
// that the eight rows a warp's 16-byte load meets fall on different banks (without it, rows K / 2 bytes
// apart, a multiple of 128, are an 8-way bank conflict). SCV: a batch's scale bytes of a row in one 8- or
// 16-byte load (without it, one 16-bit load a row a pair of steps: each a warp's load meets eight lines).
template <int K, int WG, int NB, bool SWZ, bool SCV>
struct WgGemv {
  static constexpr int KG = K / WG, S = KG / 32, NBT = S / NB;   // codes, steps (wgmmas), batches a warpgroup
  static_assert(NB % 2 == 0 && NBT % 2 == 0 && NBT >= 2, "whole pairs of steps, an even number of batches");
  static_assert(!SCV || NB == 4 || NB == 8, "a batch's scales in one 8- or 16-byte load");
  uint32_t rg, rh, u0, cx, bs, su;                // rows R0's and R0 + 8's bases; first unit; XOR; B; scale shift
  const uint8_t *sg, *sh;                         // their scale bytes
  __device__ __forceinline__ uint32_t unit(int P) const {   // byte offset of unit u0 + 2 P in a row
    return SWZ ? 16u * (u0 + ((2 * P) & ~7) + (((2 * P) & 7) ^ cx)) : 16u * (u0 + 2 * P + cx);
  }
  // Batch q's A registers and its pairs' scale words.
  __device__ __forceinline__ void load(int q, uint32_t (&a)[NB][4], uint32_t (&sc)[NB / 2][2], int t) const {
    if (SCV) {
      const int off = 2 * NB * q;                 // the batch's first block, a multiple of 2 NB
      if (NB == 8) {
        const uint4 vg = __ldg(reinterpret_cast<const uint4*>(sg + off)), vh = __ldg(reinterpret_cast<const uint4*>(sh + off));
        const uint32_t g4[4] = {vg.x, vg.y, vg.z, vg.w}, h4[4] = {vh.x, vh.y, vh.z, vh.w};
#pragma unroll
        for (int h = 0; h < NB / 2; ++h) { sc[h][0] = g4[h]; sc[h][1] = h4[h]; }
      } else {
        const uint2 vg = __ldg(reinterpret_cast<const uint2*>(sg + off)), vh = __ldg(reinterpret_cast<const uint2*>(sh + off));
        sc[0][0] = vg.x; sc[0][1] = vh.x; sc[1 % (NB / 2)][0] = vg.y; sc[1 % (NB / 2)][1] = vh.y;
      }
    }
#pragma unroll
    for (int h = 0; h < NB / 2; ++h) {
      const int P = q * (NB / 2) + h;
      const uint4 ug = lds128(rg + unit(P)), uh = lds128(rh + unit(P));
      if (!SCV) {
        sc[h][0] = __ldg(reinterpret_cast<const uint16_t*>(sg + 4 * P));
        sc[h][1] = __ldg(reinterpret_cast<const uint16_t*>(sh + 4 * P));
      }
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const uint32_t wg = (t & 1) ? (j ? ug.w : ug.y) : (j ? ug.z : ug.x);
        const uint32_t wh = (t & 1) ? (j ? uh.w : uh.y) : (j ? uh.z : uh.x);
        uint32_t(&r)[4] = a[2 * h + j];
        e2m1_to_e4m3(wg, r[0], r[2]);
        e2m1_to_e4m3(wh, r[1], r[3]);
      }
    }
  }
  __device__ __forceinline__ void issue(int q, uint32_t (&a)[NB][4], float (&d)[NB][4]) const {
#pragma unroll
    for (int s = 0; s < NB; ++s)
#pragma unroll
      for (int i = 0; i < 4; ++i) keep(a[s][i]);
    wg_fence();
#pragma unroll
    for (int s = 0; s < NB; ++s) wgmma_e4m3(d[s], a[s], b_desc(bs + 256 * (q * NB + s)));
    wg_commit();
  }
  __device__ __forceinline__ void drain(float (&d)[NB][4], const uint32_t (&sc)[NB / 2][2], float& ag, float& ah) const {
#pragma unroll
    for (int s = 0; s < NB; ++s) {
#pragma unroll
      for (int i = 0; i < 4; ++i) keep(d[s][i]);
      const int h = s >> 1, j = s & 1;
      ag = fmaf(e4m3f((sc[h][0] >> (su + 8 * j)) & 0xff), fmaf(d[s][1], 0.0625f, d[s][0]), ag);
      ah = fmaf(e4m3f((sc[h][1] >> (su + 8 * j)) & 0xff), fmaf(d[s][3], 0.0625f, d[s][2]), ah);
    }
  }
};

template <int K, int WG, int NB, bool SWZ, bool SCV>
__global__ void __launch_bounds__(128 * WG, 1) gemv_wg(const uint8_t* codes, const uint8_t* scales, const float* x,
                                                       float* y, int reps, long long* cycles, long long* bcycles) {
  using G = WgGemv<K, WG, NB, SWZ, SCV>;
  extern __shared__ __align__(16) unsigned char sm[];
  float* part = reinterpret_cast<float*>(sm);                      // WG x 64 sums
  unsigned char* bsm = sm + 4 * WG * WROWS;
  unsigned char* ws = bsm + WG * G::S * 256;
  const int wgi = threadIdx.x / 128, warp = (threadIdx.x / 32) & 3, lane = threadIdx.x % 32, g = lane >> 2, t = lane & 3;
  constexpr int UR = K / 32;                                       // 16-byte units a row
  const uint4* cb = reinterpret_cast<const uint4*>(codes + (long)blockIdx.x * WROWS * (K / 2));
  for (int i = threadIdx.x; i < WROWS * UR; i += blockDim.x) {
    const int r = i / UR, u = i % UR;
    reinterpret_cast<uint4*>(ws)[r * UR + (SWZ ? u ^ (r & 7) : u)] = cb[i];
  }
  __syncthreads();
  const long long tb = clock64();
  const int k0 = G::KG * wgi;
  const float back = build_b(bsm + wgi * G::S * 256, x + k0, G::KG);
  __syncthreads();
  const long long t0 = clock64();
  const int r0 = 16 * warp + g;
  G gm;
  gm.rg = saddr(ws) + r0 * (K / 2);
  gm.rh = gm.rg + 8 * (K / 2);
  gm.u0 = k0 / 32;
  gm.cx = SWZ ? (uint32_t)((t >> 1) ^ g) : (uint32_t)(t >> 1);
  gm.bs = saddr(bsm + wgi * G::S * 256);
  gm.su = SCV ? 16u * (t >> 1) : 0u;
  for (int it = 0; it < reps; ++it) {
    const int z = opaque0();
    gm.sg = scales + ((long)blockIdx.x * WROWS + r0) * (K / 16) + k0 / 16 + (SCV ? 0 : 2 * (t >> 1)) + z;
    gm.sh = gm.sg + 8 * (K / 16);
    float ag = 0.f, ah = 0.f;
    uint32_t a0[NB][4], a1[NB][4], s0[NB / 2][2], s1[NB / 2][2];
    float d0[NB][4], d1[NB][4];
    gm.load(0, a0, s0, t);
    gm.issue(0, a0, d0);
#pragma unroll
    for (int q = 0; q < G::NBT; q += 2) {
      gm.load(q + 1, a1, s1, t);
      gm.issue(q + 1, a1, d1);
      wg_wait<1>();
      gm.drain(d0, s0, ag, ah);
      if (q + 2 < G::NBT) {
        gm.load(q + 2, a0, s0, t);
        gm.issue(q + 2, a0, d0);
        wg_wait<1>();
      } else {
        wg_wait<0>();
      }
      gm.drain(d1, s1, ag, ah);
    }
    if (t & 1) { ag *= 1.f / 256.f; ah *= 1.f / 256.f; }
    ag = quad_sum(ag); ah = quad_sum(ah);
    if (t == 0 && it == reps - 1) { part[wgi * WROWS + r0] = ag * back; part[wgi * WROWS + r0 + 8] = ah * back; }
  }
  __syncthreads();
  if (threadIdx.x < WROWS) {
    float s = 0.f;
    for (int w = 0; w < WG; ++w) s += part[w * WROWS + threadIdx.x];
    y[blockIdx.x * WROWS + threadIdx.x] = s;
  }
  if (threadIdx.x == 0) { cycles[blockIdx.x] = clock64() - t0; bcycles[blockIdx.x] = t0 - tb; }
}

// XQ: x rounded to e4m3 first (B's part 0 exact, the others zero) and the reference taken of that x: the
// error left is the tensor core's own sums.
template <int K, int WG, int NB, bool SWZ = false, bool SCV = false, bool XQ = false>
static void run(int sms, int reps) {
  const int R = sms * WROWS;
  std::mt19937 rng(1234);
  std::vector<uint8_t> codes((size_t)R * K / 2), scales((size_t)R * K / 16);
  std::vector<float> x(K);
  random_nvfp4(rng, codes, scales, x);
  if (XQ)
    for (int i = 0; i < K; ++i) x[i] = float(__nv_fp8_e4m3(x[i]));
  const std::vector<double> ref = reference(codes, scales, x, R, K);
  uint8_t *dc, *ds; float *dy; long long *dcy, *dby;
  float* dx = upload(x);
  cudaMalloc(&dc, codes.size()); cudaMalloc(&ds, scales.size());
  cudaMalloc(&dy, 4 * R); cudaMalloc(&dcy, 8 * sms); cudaMalloc(&dby, 8 * sms);
  cudaMemcpy(dc, codes.data(), codes.size(), cudaMemcpyHostToDevice);
  cudaMemcpy(ds, scales.data(), scales.size(), cudaMemcpyHostToDevice);
  const size_t shm = 4 * WG * WROWS + (size_t)WG * WgGemv<K, WG, NB, SWZ, SCV>::S * 256 + (size_t)WROWS * K / 2;
  cudaFuncSetAttribute(gemv_wg<K, WG, NB, SWZ, SCV>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)shm);
  double bbest;
  const double best = best_cycles([&] { gemv_wg<K, WG, NB, SWZ, SCV><<<sms, 128 * WG, shm>>>(dc, ds, dx, dy, reps, dcy, dby); },
                                  dcy, sms, dby, &bbest);
  std::vector<float> yv(R);
  cudaMemcpy(yv.data(), dy, 4 * R, cudaMemcpyDeviceToHost);
  const Errors er = errors(yv, ref);
  const double per16k = best / reps / (WROWS * K / 2 / 16384.0);
  printf("K %5d  wg%d nb%-2d swz %d scv %d%s  %7.1f cycles per 16 KiB per SM  B build %6.0f cycles   max err %.3e of max |y|, rms rel err %.3e\n",
         K, WG, NB, (int)SWZ, (int)SCV, XQ ? " xq" : "", per16k, bbest, er.max_rel, er.rms_rel);
  cudaFree(dc); cudaFree(ds); cudaFree(dx); cudaFree(dy); cudaFree(dcy); cudaFree(dby);
}

int main(int argc, char** argv) {
  int sms = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  const int which = argc > 1 ? atoi(argv[1]) : 0, reps = 200;
  if (!which || which == 2048) {
    run<2048, 2, 8>(sms, reps); run<2048, 2, 8, true>(sms, reps); run<2048, 2, 8, false, true>(sms, reps);
    run<2048, 2, 8, true, true>(sms, reps); run<2048, 4, 4, true, true>(sms, reps); run<2048, 2, 4, true, true>(sms, reps);
    run<2048, 2, 4, true, true, true>(sms, reps);
  }
  if (!which || which == 4096) {
    run<4096, 2, 8>(sms, reps); run<4096, 2, 8, true, true>(sms, reps); run<4096, 4, 4, true, true>(sms, reps);
    run<4096, 4, 4, true, true, true>(sms, reps);
  }
  return 0;
}
