// Probe (standalone, runs on a GPU): int4 (AWQ: codes 0..15, an f16 scale and zero point per group of 128)
// rows times x on the integer tensor cores, mma.sync.m16n8k32 u8 x s8 -> s32, with the codes already in shared
// memory (what a landed ring stage costs the consumers, without the stream), and how exactly.
//
// e4m3_mma_gemv.cu found ptxas turns e4m3 mma.sync into f16 unpacks and HMMAs on sm_90. The 8-bit integer
// mma is older than FP8 (sm_80), so it may be native; and its sums are exact:
//  - A: a word of 8 codes is two A registers of bytes 0..15 after one shift and two ANDs (its even codes and
//    its odd codes). Lane (g, t) of warp w brings rows g and g + 8 of the block's 16; it loads 16 bytes of a row
//    once a group (words 4 t .. 4 t + 3 of the group's 16) and gives word 4 t + j to the group's mma j: the four
//    mmas of a group between them meet each of its 128 codes once, and their sums are one group's.
//  - B: x of the group over a power of two sx (its largest |x| / sx in [32, 64)), in four s8 parts q0 ..
//    q3 (q0 = rint(x / sx), each next part the rest times 128, rounded: all within +-64); column p < 4 holds
//    part p, columns 4..7 zero. A group's four mmas accumulate in s32, exactly.
//  - Per group and row, in f32: scale x (sx (part sums scaled by 128^-p) - zero x the group's f32 sum of x):
//    lane t = 0 holds parts 0 and 1, lane t = 1 parts 2 and 3, the others nothing.
// Warp w owns codes [w K/8, (w + 1) K/8) of every row (8 warps); B's fragments built once a call (timed apart).
//
//   nvcc -std=c++17 -O3 -gencode arch=compute_90a,code=sm_90a -o /tmp/int4_imma bench/probes/int4_imma_gemv.cu
//   /tmp/int4_imma [K]     # cycles per 16 KiB of codes per SM, B's build, the error against f64
//
// H200, 2026-11-29 (bench/results/probe/2026-11-29-*-int4-imma-gemv.json): the mma is native on sm_90
// (IMMA.16832.U8.S8 in the SASS, no conversions), and the sums are exact:
//   K       cycles per 16 KiB   B build (cycles, this naive form: parts recomputed per part)   rms rel error
//   2048    769                  19884                                                          1.2e-7
//   4096    784                  38645                                                          1.1e-7
//   8192    753                  77050                                                          1.7e-7
//   14336   665                 134496                                                          1.4e-7
// against, for NVFP4's codes (e4m3_mma_gemv.cu): the row-per-warp loop 1650-2150, gemv_xreg 1688, e4m3 mma.sync
// 1167-1278, wgmma 799-879 (with 14-bit sums). The build here computes each part from scratch for every part;
// wgmma_e2m1_gemv.cu's single pass (four parts of four codes a thread) took its build from 21K to 2.8K cycles.
#include "nvfp4_gemv_forms.cuh"

__device__ __forceinline__ void mma_u8s8(int (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                         uint32_t b0, uint32_t b1) {
  asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
               "{%0, %1, %2, %3};"
               : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
               : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
__device__ __forceinline__ int s8p(float v) { return (int)rintf(v) & 0xff; }

// B's fragments of this warp's range into bsm (128 bytes an mma: lanes g < 4, its two words), each group's sx and
// f32 sum of x into gsx / gsum. Mma j of group q: lane (g, t)'s b0 holds part g of codes 8 (4 t + j) + 2 i
// (i = 0..3), b1 of the odd codes after them.
__device__ void build_int4_b(uint32_t* bsm, float* gsx, float* gsum, const float* x, int KW) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, G = KW / 128;
  const int k0 = KW * warp;
  for (int q = 0; q < G; ++q) {
    const float* xg = x + k0 + 128 * q;
    float mx = 0.f, sm = 0.f;
    for (int i = lane; i < 128; i += 32) { mx = fmaxf(mx, fabsf(xg[i])); sm += xg[i]; }
    for (int o = 16; o; o >>= 1) { mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o)); sm += __shfl_xor_sync(0xffffffffu, sm, o); }
    const float sx = mx > 0.f ? ldexpf(1.f, ilogbf(mx) - 5) : 1.f;   // |x| / sx < 64
    if (lane == 0) { gsx[warp * G + q] = sx; gsum[warp * G + q] = sm; }
    // lane l < 64 builds (mma j, lane slot): j = l / 16, slot (g, t) = l % 16
    for (int l = lane; l < 64; l += 32) {
      const int j = l >> 4, g = (l >> 2) & 3, t = l & 3;
      uint32_t w[2] = {0u, 0u};
      for (int h = 0; h < 2; ++h)
        for (int i = 0; i < 4; ++i) {
          float r = xg[8 * (4 * t + j) + 2 * i + h] / sx;
          int qv = 0;
          for (int p = 0; p <= g; ++p) {
            const float c = rintf(r);
            qv = (int)c;
            r = (r - c) * 128.f;
          }
          w[h] |= (uint32_t)(qv & 0xff) << (8 * i);
        }
      bsm[(warp * G + q) * 4 * 32 + j * 32 + 2 * (4 * g + t)] = w[0];
      bsm[(warp * G + q) * 4 * 32 + j * 32 + 2 * (4 * g + t) + 1] = w[1];
    }
  }
}

template <int KW>
__global__ void __launch_bounds__(NT, 1) gemv_imma(const uint8_t* codes, const __half2* tab, const float* x, float* y,
                                                   int reps, long long* cycles, long long* bcycles) {
  constexpr int K = 8 * KW, G = KW / 128, rb = K / 2;
  extern __shared__ __align__(16) unsigned char sm[];
  float* part = reinterpret_cast<float*>(sm);                      // NW x ROWS warp sums
  float* gsx = part + NW * ROWS;                                   // NW x G
  float* gsum = gsx + NW * G;
  uint32_t* bsm = reinterpret_cast<uint32_t*>(gsum + NW * G);      // NW x G x 4 mmas x 128 bytes
  unsigned char* ws = reinterpret_cast<unsigned char*>(bsm + NW * G * 4 * 32);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane >> 2, t = lane & 3;
  load_block(ws, codes, K);
  __syncthreads();
  const long long tb = clock64();
  build_int4_b(bsm, gsx, gsum, x, KW);
  __syncthreads();
  const long long t0 = clock64();
  const int k0 = KW * warp;
  const uint32_t wa = saddr(ws) + g * rb + k0 / 2 + 16 * t, wb = wa + 8 * rb;
  const uint32_t bf = saddr(bsm) + (warp * G) * 512 + 8 * (lane & 15);
  const uint32_t msk = lane < 16 ? 0xffffffffu : 0u;
  for (int it = 0; it < reps; ++it) {
    const __half2* tg = tab + ((long)blockIdx.x * ROWS + g) * (K / 128) + k0 / 128 + opaque0();
    const __half2* th = tg + 8 * (K / 128);
    float ag = 0.f, ah = 0.f;
#pragma unroll 2
    for (int q = 0; q < G; ++q) {
      const uint4 ug = lds128(wa + 64 * q), uh = lds128(wb + 64 * q);
      const __half2 sg = __ldg(tg + q), sh = __ldg(th + q);
      int d[4] = {0, 0, 0, 0};
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const uint32_t cg = j == 0 ? ug.x : j == 1 ? ug.y : j == 2 ? ug.z : ug.w;
        const uint32_t ch = j == 0 ? uh.x : j == 1 ? uh.y : j == 2 ? uh.z : uh.w;
        uint2 bb;
        asm volatile("ld.shared.v2.u32 {%0, %1}, [%2];" : "=r"(bb.x), "=r"(bb.y) : "r"(bf + q * 512 + 128 * j));
        mma_u8s8(d, cg & 0x0f0f0f0fu, ch & 0x0f0f0f0fu, (cg >> 4) & 0x0f0f0f0fu, (ch >> 4) & 0x0f0f0f0fu, bb.x & msk, bb.y & msk);
      }
      if (t < 2) {
        const float sx = gsx[warp * G + q], zs = t == 0 ? gsum[warp * G + q] : 0.f;
        const float pw = t == 0 ? 1.f : 1.f / 16384.f;
        const float vg = fmaf((float)d[1], 1.f / 128.f, (float)d[0]) * pw, vh = fmaf((float)d[3], 1.f / 128.f, (float)d[2]) * pw;
        const float2 fg = __half22float2(sg), fh = __half22float2(sh);
        ag = fmaf(fg.x, fmaf(sx, vg, -fg.y * zs), ag);
        ah = fmaf(fh.x, fmaf(sx, vh, -fh.y * zs), ah);
      }
    }
    ag = quad_sum(ag); ah = quad_sum(ah);
    if (t == 0 && it == reps - 1) { part[warp * ROWS + g] = ag; part[warp * ROWS + g + 8] = ah; }
  }
  finish(part, y, t0, cycles);
  if (threadIdx.x == 0) bcycles[blockIdx.x] = t0 - tb;
}

template <int KW>
static void run(int sms, int reps) {
  constexpr int K = 8 * KW, G = KW / 128;
  const int R = sms * ROWS;
  std::mt19937 rng(1234);
  std::vector<uint8_t> codes((size_t)R * K / 2);
  std::vector<__half2> tab((size_t)R * K / 128);
  std::vector<float> x(K);
  for (auto& c : codes) c = rng() & 0xff;
  for (auto& s : tab) s = __floats2half2_rn(ldexpf(1.f + (rng() % 1024) / 1024.f, -8 + (int)(rng() % 5)), (float)(rng() % 16));
  std::normal_distribution<float> nd(0.f, 1.f);
  for (int i = 0; i < K; ++i) x[i] = nd(rng) * (i % 97 == 0 ? 20.f : 1.f);
  std::vector<double> ref(R);
  for (int r = 0; r < R; ++r) {
    double s = 0;
    for (int k = 0; k < K; ++k) {
      const uint8_t b = codes[(size_t)r * K / 2 + k / 2];
      const float2 sz = __half22float2(tab[(size_t)r * K / 128 + k / 128]);
      s += ((double)(k & 1 ? b >> 4 : b & 15) - sz.y) * sz.x * x[k];
    }
    ref[r] = s;
  }
  uint8_t* dc; __half2* dt; float* dy; long long *dcy, *dby;
  float* dx = upload(x);
  cudaMalloc(&dc, codes.size()); cudaMalloc(&dt, 4 * tab.size()); cudaMalloc(&dy, 4 * R);
  cudaMalloc(&dcy, 8 * sms); cudaMalloc(&dby, 8 * sms);
  cudaMemcpy(dc, codes.data(), codes.size(), cudaMemcpyHostToDevice);
  cudaMemcpy(dt, tab.data(), 4 * tab.size(), cudaMemcpyHostToDevice);
  const size_t shm = 4 * NW * ROWS + 8 * NW * G + (size_t)NW * G * 512 + (size_t)ROWS * K / 2;
  cudaFuncSetAttribute(gemv_imma<KW>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)shm);
  double bbest;
  const double best = best_cycles([&] { gemv_imma<KW><<<sms, NT, shm>>>(dc, dt, dx, dy, reps, dcy, dby); }, dcy, sms, dby, &bbest);
  std::vector<float> yv(R);
  cudaMemcpy(yv.data(), dy, 4 * R, cudaMemcpyDeviceToHost);
  const Errors er = errors(yv, ref);
  printf("K %5d  imma  %7.1f cycles per 16 KiB per SM  B build %6.0f cycles   max err %.3e of max |y|, rms rel err %.3e\n",
         K, best / reps / (ROWS * K / 2 / 16384.0), bbest, er.max_rel, er.rms_rel);
  cudaFree(dc); cudaFree(dt); cudaFree(dx); cudaFree(dy); cudaFree(dcy); cudaFree(dby);
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
