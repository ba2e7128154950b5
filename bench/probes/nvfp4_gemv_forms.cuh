// The baseline forms and shared helpers of bench/probes/e4m3_mma_gemv.cu: one block per SM, 16 rows of NVFP4
// codes resident in shared memory, 8 warps; the megakernel's row-per-warp loop (gemv_loop) and gemv_xreg's
// K = 2048 form (gemv_xreg2048), written here as the kernel runs them.
#pragma once
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cstdio>
#include <cstdlib>
#include <cstdint>
#include <cmath>
#include <vector>
#include <random>

constexpr int NW = 8, NT = 32 * NW;
constexpr int ROWS = 16;                         // rows a block holds in shared memory (one mma's rows)

__device__ __forceinline__ uint32_t lds32(uint32_t a) {
  uint32_t v;
  asm volatile("ld.shared.u32 %0, [%1];" : "=r"(v) : "r"(a));
  return v;
}
__device__ __forceinline__ uint4 lds128(uint32_t a) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(a));
  return v;
}
__device__ __forceinline__ float4 ldsf4(uint32_t a) {
  float4 v;
  asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];" : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "r"(a));
  return v;
}
// An opaque zero, so that loads of the same scales are not hoisted out of the timing loop's passes.
__device__ __forceinline__ int opaque0() {
  int z;
  asm volatile("mov.u32 %0, 0;" : "=r"(z));
  return z;
}
__device__ __forceinline__ uint32_t saddr(const void* p) { return (uint32_t)__cvta_generic_to_shared(p); }

// The block's 16 rows of codes (K / 2 bytes each) into ws, and x into xs in eight runs of K/8 (split 3) where xs is given.
__device__ void load_block(unsigned char* ws, const uint8_t* codes, int K, float* xs = nullptr, const float* x = nullptr) {
  const uint4* cb = reinterpret_cast<const uint4*>(codes + (long)blockIdx.x * ROWS * (K / 2));
  for (int i = threadIdx.x; i < ROWS * K / 32; i += NT) reinterpret_cast<uint4*>(ws)[i] = cb[i];
  if (xs != nullptr)
    for (int i = threadIdx.x; i < K; i += NT) xs[((i >> 2) & 7) * (K / 8) + ((i >> 5) << 2) + (i & 3)] = x[i];
}
__device__ __forceinline__ float warp_sum(float s) {
#pragma unroll
  for (int o = 16; o; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
  return s;
}
// The sum over the four lanes of a quad (lane t of group g).
__device__ __forceinline__ float quad_sum(float a) {
  a += __shfl_xor_sync(0xffffffffu, a, 1);
  return a + __shfl_xor_sync(0xffffffffu, a, 2);
}
// The exponent of the largest |x[k0 .. k0 + n)|, over the warp (0 if all are zero).
__device__ int warp_exp(const float* x, int k0, int n, int lane) {
  float mx = 0.f;
  for (int i = lane; i < n; i += 32) mx = fmaxf(mx, fabsf(x[k0 + i]));
#pragma unroll
  for (int o = 16; o; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
  return mx > 0.f ? ilogbf(mx) : 0;
}
// Each row's per-warp sums added in warp order into y, and thread 0's cycles since t0.
__device__ void finish(const float* part, float* y, long long t0, long long* cycles) {
  __syncthreads();
  if (threadIdx.x < ROWS) {
    float s = 0.f;
    for (int w = 0; w < NW; ++w) s += part[w * ROWS + threadIdx.x];
    y[blockIdx.x * ROWS + threadIdx.x] = s;
  }
  if (threadIdx.x == 0) cycles[blockIdx.x] = clock64() - t0;
}

// ---- loop form (the megakernel's arithmetic) ----
__device__ __forceinline__ float dot8(uint32_t u, const float4& a, const float4& b, float s) {
  const float xa[4] = {a.x, a.y, a.z, a.w}, xb[4] = {b.x, b.y, b.z, b.w};
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const uint32_t v = u >> (4 * k), h = ((v & 0x00070007u) << 9) | ((v & 0x00080008u) << 12);
    const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&h));
    s = fmaf(f.x, xa[k], s);
    s = fmaf(f.y, xb[k], s);
  }
  return s;
}
__device__ __forceinline__ float piece(const uint4& w, uint32_t xa, uint32_t hb, uint32_t sc2) {
  float4 xv[8];
#pragma unroll
  for (int m = 0; m < 8; ++m) xv[m] = ldsf4(xa + m * hb);
  const float s0 = dot8(w.y, xv[2], xv[3], dot8(w.x, xv[0], xv[1], 0.f));
  const float s1 = dot8(w.w, xv[6], xv[7], dot8(w.z, xv[4], xv[5], 0.f));
  const __half2_raw r = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)sc2, __NV_E4M3);
  const float2 bs = __half22float2(__half2(r));
  return fmaf(s0, bs.x, s1 * bs.y);
}

// xreg: gemv_xreg's K = 2048 form: a lane meets pieces l and l + 32 of every row, so it holds their 64
// activations in registers; warp w takes rows w, w + 8 (one 1 KiB segment each).
__device__ __forceinline__ float piece_x(const uint4& w, const float4 (&xv)[8], uint32_t sc2) {
  const float s0 = dot8(w.y, xv[2], xv[3], dot8(w.x, xv[0], xv[1], 0.f));
  const float s1 = dot8(w.w, xv[6], xv[7], dot8(w.z, xv[4], xv[5], 0.f));
  const __half2_raw r = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)sc2, __NV_E4M3);
  const float2 bs = __half22float2(__half2(r));
  return fmaf(s0, bs.x, s1 * bs.y);
}
__global__ void __launch_bounds__(NT, 1) gemv_xreg2048(const uint8_t* codes, const uint8_t* scales, const float* x,
                                                       float* y, int K, int reps, long long* cycles) {
  extern __shared__ __align__(16) unsigned char sm[];
  float* xs = reinterpret_cast<float*>(sm);
  unsigned char* ws = sm + 4 * K;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, rb = K / 2;
  load_block(ws, codes, K, xs, x);
  __syncthreads();
  const uint32_t xs0 = saddr(xs), ws0 = saddr(ws), hb = K / 2;
  float4 xa[8], xb[8];
#pragma unroll
  for (int m = 0; m < 8; ++m) { xa[m] = ldsf4(xs0 + 16 * lane + m * hb); xb[m] = ldsf4(xs0 + 16 * (lane + 32) + m * hb); }
  const long long t0 = clock64();
  for (int it = 0; it < reps; ++it) {
    const uint16_t* s0 = reinterpret_cast<const uint16_t*>(scales + (long)blockIdx.x * ROWS * (K / 16)) + opaque0();
    uint32_t ca = __ldg(s0 + warp * 64 + lane), cb2 = __ldg(s0 + warp * 64 + lane + 32);
    for (int r = warp; r < ROWS; r += NW) {
      const uint32_t na = r + NW < ROWS ? __ldg(s0 + (r + NW) * 64 + lane) : 0u;
      const uint32_t nb = r + NW < ROWS ? __ldg(s0 + (r + NW) * 64 + lane + 32) : 0u;
      const float d = warp_sum(piece_x(lds128(ws0 + r * rb + 16 * lane), xa, ca) +
                               piece_x(lds128(ws0 + r * rb + 16 * (lane + 32)), xb, cb2));
      if (lane == 0 && it == reps - 1) y[blockIdx.x * ROWS + r] = d * 16384.f;
      ca = na; cb2 = nb;
    }
  }
  __syncthreads();
  if (threadIdx.x == 0) cycles[blockIdx.x] = clock64() - t0;
}

// codes: R rows x K/2 bytes; scales: R rows x K/16 e4m3; x: K floats; y: R floats. Each block runs `reps`
// passes over its 16 rows (block b takes rows 16 b ..), the last pass's sums stored.
__global__ void __launch_bounds__(NT, 1) gemv_loop(const uint8_t* codes, const uint8_t* scales, const float* x,
                                                   float* y, int K, int reps, long long* cycles) {
  extern __shared__ __align__(16) unsigned char sm[];
  float* xs = reinterpret_cast<float*>(sm);                         // eight runs of K/8 (split 3)
  unsigned char* ws = sm + 4 * K;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, rb = K / 2;
  load_block(ws, codes, K, xs, x);
  __syncthreads();
  const long long t0 = clock64();
  const uint32_t xs0 = saddr(xs), ws0 = saddr(ws), hb = K / 2;   // one run, bytes
  const int P = K / 32;                                            // pieces a row
  for (int it = 0; it < reps; ++it) {
    for (int r = warp; r < ROWS; r += NW) {
      const uint16_t* sr = reinterpret_cast<const uint16_t*>(scales + ((long)blockIdx.x * ROWS + r) * (K / 16)) + opaque0();
      float s = 0.f;
      uint32_t sc = __ldg(sr + lane);
      for (int q = lane; q < P; q += 32) {
        const uint32_t scn = q + 32 < P ? __ldg(sr + q + 32) : 0u;
        s += piece(lds128(ws0 + r * rb + 16 * q), xs0 + 16 * q, hb, sc);
        sc = scn;
      }
      s = warp_sum(s);
      if (lane == 0 && it == reps - 1) y[blockIdx.x * ROWS + r] = s * 16384.f;
    }
  }
  __syncthreads();
  if (threadIdx.x == 0) cycles[blockIdx.x] = clock64() - t0;
}

// ---- shared by the tensor-core forms (e4m3_mma_gemv.cu, wgmma_e2m1_gemv.cu) ----
// A word of 8 e2m1 codes (byte i: code 2i low nibble, 2i + 1 high) as two words of 4 e4m3 codes, each
// the code times 2^-6: the even codes' and the odd codes', byte i of each from byte i of u.
__device__ __forceinline__ void e2m1_to_e4m3(uint32_t u, uint32_t& ev, uint32_t& od) {
  ev = ((u << 2) & 0x1c1c1c1cu) | ((u << 4) & 0x80808080u);
  od = ((u >> 2) & 0x1c1c1c1cu) | (u & 0x80808080u);
}
__device__ __forceinline__ uint32_t e4m3x4_rn(float a, float b, float c, float d) {
  const uint32_t lo = __nv_cvt_float2_to_fp8x2(make_float2(a, b), __NV_SATFINITE, __NV_E4M3);
  const uint32_t hi = __nv_cvt_float2_to_fp8x2(make_float2(c, d), __NV_SATFINITE, __NV_E4M3);
  return lo | (hi << 16);
}
__device__ __forceinline__ float e4m3f(uint32_t b) {
  const __half_raw h = __nv_cvt_fp8_to_halfraw((__nv_fp8_storage_t)b, __NV_E4M3);
  return __half2float(__half(h));
}
// Part p of r (an activation times its warp's power of two): what parts 0 .. p - 1, each rounded to e4m3,
// left of it; with sp each part is taken times 16 before the next is rounded (part p is then 16^p times
// its share, and its column is scaled back after the mma).
__device__ __forceinline__ float x_part(float r, int p, bool sp) {
  for (int q = 0; q < p; ++q) {
    const float c = e4m3f(__nv_cvt_float_to_fp8(r, __NV_SATFINITE, __NV_E4M3));
    r = sp ? (r - c) * 16.f : r - c;
  }
  return r;
}
// B's two words for a word of 8 codes whose activations start at xw: part p of the even codes' (b0) and
// of the odd codes' (b1), each four e4m3 in code order.
__device__ __forceinline__ void b_words(const float* xw, float up, int p, bool sp, uint32_t (&bw)[2]) {
#pragma unroll
  for (int h = 0; h < 2; ++h)
    bw[h] = e4m3x4_rn(x_part(xw[h] * up, p, sp), x_part(xw[2 + h] * up, p, sp), x_part(xw[4 + h] * up, p, sp),
                      x_part(xw[6 + h] * up, p, sp));
}

// ---- host side: the f64 reference ----
static float e2m1v(int c) {
  static const float v[8] = {0.f, .5f, 1.f, 1.5f, 2.f, 3.f, 4.f, 6.f};
  return (c & 8) ? -v[c & 7] : v[c & 7];
}
static float e4m3v(uint8_t b) {
  const int s = b >> 7, e = (b >> 3) & 15, m = b & 7;
  const float f = e ? ldexpf(1.f + m / 8.f, e - 7) : ldexpf(m / 8.f, -6);
  return s ? -f : f;
}

// Each row's sum in f64: the codes' values times their blocks' scales times x.
static std::vector<double> reference(const std::vector<uint8_t>& codes, const std::vector<uint8_t>& scales,
                                     const std::vector<float>& x, int R, int K) {
  std::vector<double> ref(R);
  for (int r = 0; r < R; ++r) {
    double s = 0;
    for (int k = 0; k < K; ++k) {
      const uint8_t b = codes[(size_t)r * K / 2 + k / 2];
      s += (double)e2m1v(k & 1 ? b >> 4 : b & 15) * e4m3v(scales[(size_t)r * K / 16 + k / 16]) * x[k];
    }
    ref[r] = s;
  }
  return ref;
}
static float* upload(const std::vector<float>& v) {
  float* d;
  cudaMalloc(&d, 4 * v.size());
  cudaMemcpy(d, v.data(), 4 * v.size(), cudaMemcpyHostToDevice);
  return d;
}
// Random NVFP4 rows and x, seeded: codes any byte, e4m3 block scales 2^-3 .. 2^4, x normal with every 97th
// value 20 times larger.
static void random_nvfp4(std::mt19937& rng, std::vector<uint8_t>& codes, std::vector<uint8_t>& scales,
                         std::vector<float>& x) {
  for (auto& c : codes) c = rng() & 0xff;
  for (auto& s : scales) { int e = 4 + rng() % 8, m = rng() % 8; s = (uint8_t)((e << 3) | m); }
  std::normal_distribution<float> nd(0.f, 1.f);
  for (size_t i = 0; i < x.size(); ++i) x[i] = nd(rng) * (i % 97 == 0 ? 20.f : 1.f);
}
// A launch's errors against the f64 sums: the largest relative to the largest |ref|, and the rms relative.
struct Errors { double max_rel, rms_rel; };
static Errors errors(const std::vector<float>& y, const std::vector<double>& ref) {
  double maxerr = 0, maxref = 0, sq = 0, sqr = 0;
  for (size_t r = 0; r < ref.size(); ++r) {
    maxerr = std::max(maxerr, std::fabs(y[r] - ref[r]));
    maxref = std::max(maxref, std::fabs(ref[r]));
    sq += (y[r] - ref[r]) * (y[r] - ref[r]); sqr += ref[r] * ref[r];
  }
  return {maxerr / maxref, std::sqrt(sq / sqr)};
}
// The least over `trials` launches of the blocks' mean cycles (each block's count in dcy[sms]); with dby, the
// least mean of that second count too (into *bbest). Exits on a launch error.
template <typename Launch>
static double best_cycles(Launch launch, const long long* dcy, int sms, const long long* dby = nullptr,
                          double* bbest = nullptr, int trials = 3) {
  std::vector<long long> cy(sms), by(sms);
  double best = 1e30;
  if (bbest) *bbest = 1e30;
  for (int trial = 0; trial < trials; ++trial) {
    launch();
    cudaError_t e = cudaGetLastError();
    if (e == cudaSuccess) e = cudaDeviceSynchronize();
    if (e != cudaSuccess) { printf("CUDA error %s\n", cudaGetErrorString(e)); exit(1); }
    cudaMemcpy(cy.data(), dcy, 8 * sms, cudaMemcpyDeviceToHost);
    double mean = 0, bmean = 0;
    for (int i = 0; i < sms; ++i) mean += (double)cy[i] / sms;
    best = std::min(best, mean);
    if (dby) {
      cudaMemcpy(by.data(), dby, 8 * sms, cudaMemcpyDeviceToHost);
      for (int i = 0; i < sms; ++i) bmean += (double)by[i] / sms;
      *bbest = std::min(*bbest, bmean);
    }
  }
  return best;
}

