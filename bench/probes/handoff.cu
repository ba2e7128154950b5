// Probe: the latency of one block handing a vector to another while every SM streams weights, in the
// megakernel's way (a release on a counter, a polled acquire, then the data load) and with each value
// carried in one 8-byte word beside the step's epoch, polled by its reader (no counter, no fence).
// Build and run on the GPU: nvcc -arch=sm_90a -O3 -o handoff bench/probes/handoff.cu && ./handoff
// Results: bench/results/probe/2026-11-26-fee0ff4-handoff-latency.json.
#include <cstdio>
#include <cstdint>
#include <cstdlib>
#include <cuda_runtime.h>
#define NT 288
#define STAGE (16 * 1024)
#define NSTAGE 8
struct Args { uint32_t* flags; float* data; unsigned long long* ll; const char* src; size_t src_bytes;
  volatile int* stop; unsigned long long* out; int mode; int load; int iters; int nelem; int inflight; };

__device__ __forceinline__ unsigned long long gtime() { unsigned long long t; asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); return t; }
__device__ __forceinline__ uint32_t ld_acq(const uint32_t* p) { uint32_t v; asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory"); return v; }
__device__ __forceinline__ void red_rel(uint32_t* p, uint32_t v) { asm volatile("red.release.gpu.global.add.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory"); }
__device__ __forceinline__ unsigned long long ld_rlx64(const unsigned long long* p) { unsigned long long v; asm volatile("ld.relaxed.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory"); return v; }
__device__ __forceinline__ void st_rlx64(unsigned long long* p, unsigned long long v) { asm volatile("st.relaxed.gpu.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory"); }
__device__ __forceinline__ void bar(int n) { asm volatile("bar.sync 1, %0;" ::"r"(n)); }

__device__ void loader(const Args& a, char* smem, uint64_t* mb) {
  if ((threadIdx.x & 31) != 0) return;
  for (int s = 0; s < NSTAGE; ++s) asm volatile("mbarrier.init.shared.b64 [%0], 1;" ::"r"((uint32_t)__cvta_generic_to_shared(mb + s)));
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  uint64_t pol; asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol));
  const size_t nchunk = a.src_bytes / STAGE;
  size_t k = blockIdx.x; uint32_t issued = 0, done = 0;
  while (true) {
    while (issued - done < (uint32_t)a.inflight) {
      int s = issued % NSTAGE;
      uint32_t m = __cvta_generic_to_shared(mb + s), d = __cvta_generic_to_shared(smem + s * STAGE);
      asm volatile("mbarrier.arrive.expect_tx.shared.b64 _, [%0], %1;" ::"r"(m), "r"(STAGE) : "memory");
      const char* g = a.src + (k % nchunk) * STAGE; k += gridDim.x;
      asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, [%3], %4;"
                   ::"r"(d), "l"(g), "r"(STAGE), "r"(m), "l"(pol) : "memory");
      ++issued;
    }
    int s = done % NSTAGE; uint32_t par = (done / NSTAGE) & 1, m = __cvta_generic_to_shared(mb + s);
    uint32_t ok = 0;
    while (!ok) asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }" : "=r"(ok) : "r"(m), "r"(par) : "memory");
    ++done;
    if ((done & 63) == 0 && *a.stop) break;
  }
  while (done < issued) { int s = done % NSTAGE; uint32_t par = (done / NSTAGE) & 1, m = __cvta_generic_to_shared(mb + s); uint32_t ok = 0;
    while (!ok) asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }" : "=r"(ok) : "r"(m), "r"(par) : "memory"); ++done; }
  if (blockIdx.x == 0) a.out[4] = done;  // copies by block 0
  atomicAdd(a.out + 5, (unsigned long long)done);
}

__global__ void __launch_bounds__(NT, 1) kern(Args a) {
  extern __shared__ __align__(128) char smem[];
  uint64_t* mb = reinterpret_cast<uint64_t*>(smem + NSTAGE * STAGE);
  const int t = threadIdx.x, w = t / 32;
  if (w == 8) { if (a.load) loader(a, smem, mb); return; }
  const int me = blockIdx.x;
  if (me > 1) return;
  const int other = 1 - me;
  // warm-up wait so the loaders are running
  unsigned long long t0 = gtime();
  while (gtime() - t0 < 200000) {}
  bar(256);
  t0 = gtime();
  const int n = a.nelem;
  float acc = 0.f;
  for (int i = 0; i < a.iters; ++i) {
    const bool my_turn_first = (me == 0);
    // receive (except block 0 on i == 0)
    if (!(my_turn_first && i == 0)) {
      const uint32_t want = my_turn_first ? i : i + 1;  // messages from other so far
      if (a.mode == 0) {
        if (t == 0) { while ((int)(ld_acq(a.flags + other * 32) - want) < 0) __nanosleep(64); }
        bar(256);
        if (t < n) acc += __ldcg(a.data + other * 1024 + t);
      } else {
        if (t < n) {
          const unsigned long long* p = a.ll + other * 1024 + t;
          unsigned long long v;
          while ((uint32_t)((v = ld_rlx64(p)) >> 32) != want) {}
          acc += __uint_as_float((uint32_t)v);
        }
        bar(256);
      }
    }
    // send message number (i + 1) from me
    if (a.mode == 0) {
      if (t < n) a.data[me * 1024 + t] = acc;
      bar(256);
      if (t == 0) red_rel(a.flags + me * 32, 1u);
    } else {
      if (t < n) st_rlx64(a.ll + me * 1024 + t, ((unsigned long long)(uint32_t)(i + 1) << 32) | __float_as_uint(acc));
    }
  }
  const unsigned long long t1 = gtime();
  if (t == 0 && me == 0) { a.out[0] = t1 - t0; *a.stop = 1; }
  if (t == 0 && me == 1) a.out[1] = t1 - t0;
  if (t < n && acc == -1.f) a.out[7] = 1;
}

int main(int argc, char** argv) {
  int dev = 0; cudaSetDevice(dev);
  cudaDeviceProp p; cudaGetDeviceProperties(&p, dev);
  const int nsm = p.multiProcessorCount;
  size_t src_bytes = (size_t)4 << 30;
  char* src; cudaMalloc(&src, src_bytes); cudaMemset(src, 1, src_bytes);
  uint32_t* flags; float* data; unsigned long long *ll, *out; int* stop;
  cudaMalloc(&flags, 4096); cudaMalloc(&data, 8192 * 4); cudaMalloc(&ll, 8192 * 8); cudaMalloc(&out, 64); cudaMalloc(&stop, 4);
  const size_t smem = NSTAGE * STAGE + 1024;
  cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
  printf("%s, %d SMs\n", p.name, nsm);
  printf("mode load inflight nelem | one-way hand-off us | background GB/s\n");
  for (int load = 0; load <= 1; ++load)
    for (int nelem : {256, 64})
      for (int mode = 0; mode <= 1; ++mode) {
        for (int rep = 0; rep < 2; ++rep) {
          cudaMemset(flags, 0, 4096); cudaMemset(ll, 0, 8192 * 8); cudaMemset(out, 0, 64); cudaMemset(stop, 0, 4);
          Args a{flags, data, ll, src, src_bytes, stop, out, mode, load, 4000, nelem, 2};
          cudaEvent_t e0, e1; cudaEventCreate(&e0); cudaEventCreate(&e1);
          cudaEventRecord(e0);
          kern<<<nsm, NT, smem>>>(a);
          cudaEventRecord(e1);
          cudaError_t e = cudaDeviceSynchronize();
          if (e != cudaSuccess) { printf("error %s\n", cudaGetErrorString(e)); return 1; }
          float ms; cudaEventElapsedTime(&ms, e0, e1);
          unsigned long long h[8]; cudaMemcpy(h, out, 64, cudaMemcpyDeviceToHost);
          double oneway = h[0] / 1e3 / (2.0 * a.iters);
          double gbs = load ? (double)h[5] * STAGE / (ms * 1e-3) / 1e9 : 0;
          if (rep == 1) printf("%s %d %d %d | %.3f | %.0f (whole kernel %.2f ms)\n", mode ? "LL     " : "counter", load, a.inflight, nelem, oneway, gbs, ms);
        }
      }
  return 0;
}
