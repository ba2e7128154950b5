// Probe (compile only): the register budget a block's warp count leaves each thread, and what
// setmaxnreg gives back. An SM's 65536 registers are split over its four schedulers (16384 each), and a
// block's warps go to them in turn, so 9 warps (the megakernel's 8 consumers and its loader) put 3 on one
// scheduler: 16384 / 96 threads caps every thread at 168 registers, as 12 warps do; 8 warps allow 255.
// With 12 warps, a producer warpgroup that gives registers back (setmaxnreg.dec) lets the two consumer
// warpgroups take 232 each (setmaxnreg.inc) in code ptxas compiles to that budget.
//   nvcc -gencode arch=compute_90a,code=sm_90a -c bench/probes/regcap.cu -Xptxas -v
// Results (nvcc 13.0, 2026-11-26): `capped<256>` 238 registers, no spills; `capped<288>` and `capped<384>`
// 168 registers, 824 bytes of spill stores; `roles` (384 threads, consumers at 232) 0 spills.
// N live floats a thread (about N registers wanted), read with stride NT, mixed n times, summed.
template <int N, int NT>
__device__ __forceinline__ void work(const float* __restrict__ x, float* y, int n) {
  float a[N];
#pragma unroll
  for (int i = 0; i < N; ++i) a[i] = x[threadIdx.x + i * NT];
  for (int it = 0; it < n; ++it) {
#pragma unroll
    for (int i = 0; i < N; ++i) a[i] = a[i] * a[(i + 7) % N] + a[(i + 13) % N];
  }
  float s = 0.f;
#pragma unroll
  for (int i = 0; i < N; ++i) s += a[i] * (i + 1);
  y[threadIdx.x] = s;
}

template <int NT>
__global__ void __launch_bounds__(NT, 1) capped(const float* __restrict__ x, float* y, int n) {
  work<230, NT>(x, y, n);
}
template __global__ void capped<256>(const float*, float*, int);
template __global__ void capped<288>(const float*, float*, int);
template __global__ void capped<384>(const float*, float*, int);

__global__ void __launch_bounds__(384, 1) roles(const float* __restrict__ x, float* y, int n) {
  if (threadIdx.x / 128 == 0) {                  // the producer warpgroup: a loader would run here
    asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n");
    if (threadIdx.x == 0) y[0] = 1.f;
    return;
  }
  asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n");
  work<200, 384>(x, y, n);
}
