// Probe: what one landed 16 KiB ring stage costs the register GEMV (instructions/gemv_core.cuh,
// gemv_regs with bf16 rows of one 4 KiB chunk, K = 2048: four rows a stage). In the megakernel the chain's
// o and q tiles take 590-600 cycles a stage with every stage landed (session 43's phase probe); this
// kernel runs the same loop alone on one SM, its stages already in shared memory, and takes parts away:
//   0  the loop as the megakernel runs it: wait on the stage's full barrier (already complete), four
//      16-byte loads, four 8-element dots, release (syncwarp + lane 0's arrive), the 4-row butterfly,
//      the warp's row sums stored
//   1  no barrier wait and no release
//   2  no butterfly: each lane keeps its rows' sums, one butterfly a tile at the end
//   3  1 and 2 together
//   4  loads only (the dots and the butterfly skipped; their inputs still consumed)
//   5  each lane keeps its 32 rows' sums over 8 stages, then one exchange-halves reduction of the 32
//      (31 shuffles; lane l ends with row l's warp total, the same lane pairing as 0, so the same bits)
//   6  0 with the next stage's loads issued before this stage's sums (two stages' loads in flight)
//   7  5 with the next stage's loads issued before this stage's sums
//   nvcc -std=c++17 -O3 -gencode arch=compute_90a,code=sm_90a -o /tmp/landed bench/probes/landed_gemv.cu
//   /tmp/landed            (prints cycles a stage, per variant, for 4, 11 and 44 stages a tile)
// Results (H100, nvcc 13.0, 2026-11-27; bench/results/probe/2026-11-27-a8f1012+wip-landed-gemv.json), cycles a
// stage at 4 / 11 / 44 stages: 0: 531 / 513 / 501; 1: 483 / 465 / 460; 2: 395 / 341 / 312; 3: 344 / 291 / 263;
// 4: 363 / 293 / 266; 5: 530 / 452 / 402; 6: 639 / 620 / 600; 7: 549 / 470 / 443.
#include <cstdio>
#include <cstdint>
#include <cuda_bf16.h>

constexpr int NCT = 256, NCW = 8, STAGES = 10, STAGE_BYTES = 16384, CHUNK = NCT * 16, CPS = STAGE_BYTES / CHUNK;

__device__ __forceinline__ uint32_t smem_addr(const void* p) { return (uint32_t)__cvta_generic_to_shared(p); }
__device__ __forceinline__ bool try_wait(uint32_t bar, uint32_t parity) {
  uint32_t ok;
  asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
               : "=r"(ok) : "r"(bar), "r"(parity) : "memory");
  return ok;
}
__device__ __forceinline__ void arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}
__device__ __forceinline__ uint4 lds128(uint32_t a) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(a));
  return v;
}
__device__ __forceinline__ float dot8(const uint4& w, const float (&x)[8]) {
  const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&w);
  const float2 a = __bfloat1622float2(h[0]), b = __bfloat1622float2(h[1]);
  const float2 d = __bfloat1622float2(h[2]), e = __bfloat1622float2(h[3]);
  float s = a.x * x[0], t = d.x * x[4];
  s = fmaf(a.y, x[1], s); t = fmaf(d.y, x[5], t);
  s = fmaf(b.x, x[2], s); t = fmaf(e.x, x[6], t);
  s = fmaf(b.y, x[3], s); t = fmaf(e.y, x[7], t);
  return s + t;
}
__device__ __forceinline__ float sum4(float (&v)[4], int lane) {   // gemv_core's warp_sum_rows<4>
  const bool hi = lane & 16, mid = lane & 8;
  const float a = (hi ? v[2] : v[0]) + __shfl_xor_sync(0xffffffffu, hi ? v[0] : v[2], 16);
  const float b = (hi ? v[3] : v[1]) + __shfl_xor_sync(0xffffffffu, hi ? v[1] : v[3], 16);
  float k = (mid ? b : a) + __shfl_xor_sync(0xffffffffu, mid ? a : b, 8);
  for (int o = 4; o > 0; o >>= 1) k += __shfl_xor_sync(0xffffffffu, k, o);
  return k;
}

// 32 values a lane, exchanged in halves over offsets 16, 8, 4, 2, 1: lane l ends with value l's warp sum.
template <int N>
__device__ __forceinline__ void halve(float (&v)[32], int lane) {   // v[0:N] -> v[0:N/2], offset N/2
  const bool up = lane & (N / 2);
#pragma unroll
  for (int j = 0; j < N / 2; ++j) {
    const float keep = up ? v[j + N / 2] : v[j], send = up ? v[j] : v[j + N / 2];
    v[j] = keep + __shfl_xor_sync(0xffffffffu, send, N / 2);
  }
}
__device__ __forceinline__ float sum32(float (&v)[32], int lane) {
  halve<32>(v, lane);
  halve<16>(v, lane);
  halve<8>(v, lane);
  halve<4>(v, lane);
  halve<2>(v, lane);
  return v[0];
}

template <int V>
__global__ void __launch_bounds__(NCT, 1) landed(int stages, int reps, float* out, long long* cycles) {
  extern __shared__ __align__(128) unsigned char smem[];
  unsigned long long* full = reinterpret_cast<unsigned long long*>(smem + STAGES * STAGE_BYTES);
  unsigned long long* empty = full + STAGES;
  float* part = reinterpret_cast<float*>(empty + STAGES);      // [NCW][stages * CPS rows]
  const int t = threadIdx.x, warp = t / 32, lane = t % 32;
  for (int i = t; i < STAGES * STAGE_BYTES / 4; i += NCT) reinterpret_cast<uint32_t*>(smem)[i] = 0x3f803f80u ^ i;
  if (t == 0)
    for (int s = 0; s < STAGES; ++s) {
      asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem_addr(full + s)));
      asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(empty + s)), "r"((1 << 20) - 1));
      arrive(smem_addr(full + s));                            // phase 0 complete: every stage landed
    }
  __syncthreads();
  float x[8];
  for (int e = 0; e < 8; ++e) x[e] = 1.f + 0.001f * (t * 8 + e);
  long long best = 1LL << 62;
  float keep = 0.f;
  for (int r = 0; r < reps; ++r) {
    __syncthreads();
    const long long c0 = clock64();
    float acc[4] = {0.f, 0.f, 0.f, 0.f};
    if (V == 5) {
      for (int s0 = 0; s0 < stages; s0 += 8) {
        float grp[32];
#pragma unroll
        for (int g = 0; g < 8; ++g) {
          const int s = s0 + g, st = s % STAGES;
          if (s < stages) {
            while (!try_wait(smem_addr(full + st), 0)) {}
            const uint32_t a = smem_addr(smem + st * STAGE_BYTES) + 16 * t;
            uint4 w[CPS];
#pragma unroll
            for (int k = 0; k < CPS; ++k) w[k] = lds128(a + k * CHUNK);
#pragma unroll
            for (int i = 0; i < 4; ++i) grp[4 * g + i] = dot8(w[i], x);
            __syncwarp();
            if (lane == 0) arrive(smem_addr(empty + st));
          } else {
#pragma unroll
            for (int i = 0; i < 4; ++i) grp[4 * g + i] = 0.f;
          }
        }
        const float tot = sum32(grp, lane);
        part[warp * 256 + (s0 * 4 + lane) % 256] = tot;
      }
    }
    if (V == 6 || V == 7) {                      // software-pipelined: stage s + 1's pieces load during s
      uint4 w[CPS], wn[CPS];
      auto load = [&](int s, uint4 (&dst)[CPS]) {
        const int st = s % STAGES;
        while (!try_wait(smem_addr(full + st), 0)) {}
        const uint32_t a = smem_addr(smem + st * STAGE_BYTES) + 16 * t;
#pragma unroll
        for (int k = 0; k < CPS; ++k) dst[k] = lds128(a + k * CHUNK);
      };
      load(0, w);
      for (int s0 = 0; s0 < stages; s0 += 8) {
        float grp[32];
#pragma unroll
        for (int g = 0; g < 8; ++g) {
          const int s = s0 + g;
          if (s < stages) {
            if (s + 1 < stages) load(s + 1, wn);
            float rs[4];
#pragma unroll
            for (int i = 0; i < 4; ++i) rs[i] = dot8(w[i], x);
            __syncwarp();
            if (lane == 0) arrive(smem_addr(empty + s % STAGES));
            if (V == 6) {
              const float tot = sum4(rs, lane);
              if ((lane & 7) == 0) part[warp * 256 + (s * 4 + lane / 8) % 256] = tot;
            } else {
#pragma unroll
              for (int i = 0; i < 4; ++i) grp[4 * g + i] = rs[i];
            }
#pragma unroll
            for (int k = 0; k < CPS; ++k) w[k] = wn[k];
          } else {
#pragma unroll
            for (int i = 0; i < 4; ++i) grp[4 * g + i] = 0.f;
          }
        }
        if (V == 7) {
          const float tot = sum32(grp, lane);
          part[warp * 256 + (s0 * 4 + lane) % 256] = tot;
        }
      }
    }
    for (int s = 0; s < (V >= 5 ? 0 : stages); ++s) {
      const int st = s % STAGES;
      if (V == 0 || V == 2) while (!try_wait(smem_addr(full + st), 0)) {}
      const uint32_t a = smem_addr(smem + st * STAGE_BYTES) + 16 * t;
      uint4 w[CPS];
#pragma unroll
      for (int k = 0; k < CPS; ++k) w[k] = lds128(a + k * CHUNK);
      float rs[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) rs[i] = V == 4 ? __uint_as_float(w[i].x ^ w[i].w) : dot8(w[i], x);
      if (V == 0 || V == 2) {
        __syncwarp();
        if (lane == 0) arrive(smem_addr(empty + st));
      }
      if (V == 0 || V == 1) {
        const float tot = sum4(rs, lane);
        if ((lane & 7) == 0) part[warp * 256 + (s * 4 + lane / 8) % 256] = tot;
      } else {
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[i] += rs[i];
      }
    }
    if (V >= 2 && V < 5) {
      const float tot = sum4(acc, lane);
      if ((lane & 7) == 0) part[warp * 256 + lane / 8] = tot;
    }
    __syncthreads();
    const long long c1 = clock64();
    best = c1 - c0 < best ? c1 - c0 : best;
    keep += part[t % 256];
  }
  out[t] = keep;
  if (t == 0) *cycles = best;
}

template <int V>
void run(int stages) {
  float* out;
  long long* cyc;
  cudaMalloc(&out, NCT * 4);
  cudaMalloc(&cyc, 8);
  const int smem = STAGES * STAGE_BYTES + 2 * STAGES * 8 + NCW * 256 * 4;
  cudaFuncSetAttribute(landed<V>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  landed<V><<<1, NCT, smem>>>(stages, 200, out, cyc);
  long long c = 0;
  cudaMemcpy(&c, cyc, 8, cudaMemcpyDeviceToHost);
  printf("variant %d  stages %3d  %6lld cycles a tile  %6.1f a stage  %s\n", V, stages, c, (double)c / stages,
         cudaGetErrorString(cudaGetLastError()));
  cudaFree(out);
  cudaFree(cyc);
}

int main() {
  for (int stages : {4, 11, 44}) {
    run<0>(stages);
    run<1>(stages);
    run<2>(stages);
    run<3>(stages);
    run<4>(stages);
    run<5>(stages);
    run<6>(stages);
    run<7>(stages);
  }
  return 0;
}
