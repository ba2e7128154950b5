// LoRA inside the projections (instructions/lora.py): producers write partial products of the next
// projections' A with the rows they produce; a projection tile sums them and adds its rows of B u.
// A task starts the adapter id's load first (lora_begin) and, once its x is in, sends the adapter
// rows it will read towards L2 (lora_prefetch_*), so both land while the GEMV streams.
#pragma once
#include "device.cuh"
#include "tagged.cuh"

// The step's adapter id (0, none, when the slot is empty): loaded at the top of the task, used after.
__device__ __forceinline__ int lora_begin(const mvm_ctx& c, int id_buf) {
  return id_buf < 0 ? 0 : __ldcg((const int*)buf(c, id_buf));
}

// An id outside the adapters the program holds fails the launch with a dump, never reads out of bounds.
__device__ __forceinline__ bool lora_id_ok(mvm_ctx& c, int id, int stacked) {
  return stacked < 0 || input_in_range(c, id, bufinfo(c, stacked).shape[0]);
}

__device__ __forceinline__ void prefetch_l2(const void* p, long bytes, int tid, int nthreads) {
  for (long o = (long)tid * 128; o < bytes; o += (long)nthreads * 128)
    asm volatile("prefetch.global.L2::evict_last [%0];" ::"l"((const char*)p + o));
}

// The consumer's rows of B: [id, halves x (row0, nrows), R].
__device__ void lora_prefetch_b(const mvm_ctx& c, int bb, int id, int row0, int nrows, int halves) {
  if (bb < 0 || id <= 0 || id >= bufinfo(c, bb).shape[0]) return;
  const mvm_buffer_t& bi = bufinfo(c, bb);
  const int isz = elem_bytes(bi.dtype), R = (int)bi.shape[2];
  const long rows = bi.shape[1] / halves;
  for (int hf = 0; hf < halves; ++hf)
    prefetch_l2((const char*)buf(c, bb) + ((long)id * bi.shape[1] + hf * rows + row0) * R * isz, (long)nrows * R * isz,
                c.tid, NCT);
}

// The producer's columns of A: [id, every j, col0:col0 + n].
__device__ void lora_prefetch_a(const mvm_ctx& c, int ab, int id, int col0, int n) {
  if (ab < 0 || id <= 0 || id >= bufinfo(c, ab).shape[0]) return;
  const mvm_buffer_t& ai = bufinfo(c, ab);
  const int isz = elem_bytes(ai.dtype), J = (int)ai.shape[1];
  const char* a = (const char*)buf(c, ab) + ((long)id * J * ai.shape[2] + col0) * isz;
  for (int j = c.warp; j < J; j += NCW)
    prefetch_l2(a + (long)j * ai.shape[2] * isz, (long)n * isz, c.lane, 32);
}

// Element r of the produced values: vs[r] where the task kept them in shared memory, else row v0 + r of
// activation y at ybase, which this block wrote before a consumer_sync (a tagged y holds each value in
// the low half of its word).
__device__ __forceinline__ float lora_v(const float* vs, const float* ybase, bool ytag, long v0, int r) {
  return vs ? vs[r] : ytag ? __ldcg(ybase + 2 * (v0 + r)) : __ldcg(ybase + v0 + r);
}

template <typename T>
__device__ void lora_produce_t(mvm_ctx& c, const T* A, float* U, bool utag, int J, long L, int id, int col0,
                               const float* vs, const float* ybase, bool ytag, long v0, int n, int gamma) {
  constexpr int U4 = 4;                          // columns a warp loads before it reduces them
  const uint32_t tag = step_tag(c);
  if (utag) tag_release();
  for (int j0 = c.warp * U4; j0 < J; j0 += NCW * U4) {
    float s[U4] = {};
    for (int r = c.lane; r < n; r += 32) {
      const float v = lora_v(vs, ybase, ytag, v0, r);
      const float x = gamma < 0 ? v : v * weight_at(c, gamma, col0 + r);
#pragma unroll
      for (int k = 0; k < U4; ++k)
        if (j0 + k < J) s[k] = fmaf(to_f(A[((long)id * J + j0 + k) * L + col0 + r]), x, s[k]);
    }
#pragma unroll
    for (int k = 0; k < U4; ++k) {
      const float t = warp_sum(s[k]);
      if (c.lane == 0 && j0 + k < J) act_store(U, utag, j0 + k, t, tag);
    }
  }
}

// The producer side: U[t, j] = sum_r A[id, j, col0 + r] g[col0 + r] v[r] over the n values v, rows v0 ..
// v0 + n of activation y (its buffer yb at ybase, written by this block before a consumer_sync; or vs in
// shared memory, where not null; g the next projections' RMSNorm weight, or 1 where gamma is -1). U and
// y may be tagged (tagged.cuh): U's words are then polled by the consumers, and no counter orders them.
// Nothing for id 0. Returns false when the id is out of range.
__device__ bool lora_produce(mvm_ctx& c, int ab, int ub, int id, int t, int col0, const float* vs, int yb,
                             const float* ybase, long v0, int n, int gamma = -1) {
  if (ab < 0) return true;
  if (!lora_id_ok(c, id, ab)) return false;
  if (id == 0) return true;
  const mvm_buffer_t& ai = bufinfo(c, ab);
  const int J = (int)ai.shape[1];
  const bool utag = buf_tagged(c, ub), ytag = buf_tagged(c, yb);
  float* U = (float*)buf(c, ub) + (utag ? 2 : 1) * (long)t * J;
  if (ai.dtype == MVM_BF16)
    lora_produce_t(c, (const __nv_bfloat16*)buf(c, ab), U, utag, J, ai.shape[2], id, col0, vs, ybase, ytag, v0, n,
                   gamma);
  else
    lora_produce_t(c, (const float*)buf(c, ab), U, utag, J, ai.shape[2], id, col0, vs, ybase, ytag, v0, n, gamma);
  return true;
}

template <typename T>
__device__ void lora_rows_t(int tid, const T* B, int R, const float* u, int nrows, float* acc) {
  for (int r = tid; r < nrows; r += NCT) {
    const T* b = B + (long)r * R;                // staged in xs, or global
    float s = 0.f;
#pragma unroll 16
    for (int j = 0; j < R; ++j) s = fmaf(to_f(b[j]), u[j], s);
    acc[r] += s;
  }
}

// Partial products a consumer thread loads before it settles the first (a q/k/v tile's 16 columns of 128
// down tiles' partials: each of 256 threads sums 8 of them, one round trip).
constexpr int LORA_LOADS = 8;

// lora_add's work, out of line (inlined in four opcodes, its loads in flight made the main loop spill).
// The partial products U [T, ncol] (utag: their tag, 0 when plain) summed over producers for columns
// col0 .. col0 + halves R, times s, then each half's rows of B (at b0, the next half hstride bytes on;
// bf16 or f32) against them, added to acc. B's rows are copied into xs while the partials load, where
// they fit and align. Starts and ends with a consumer_sync.
__device__ __noinline__ void lora_add_rows(const mvm_args_t* a, const mvm_instr_t* ins, uint32_t block, uint32_t qpos,
                                           uint32_t utag, int ub, const float* U, int T, int ncol, int col0,
                                           const char* b0, long hstride, bool bf16, int R, int nrows, float s,
                                           int halves, int tid, float* xs, float* acc) {
  const int C = halves * R, chunks = max(1, NCT / C), isz = bf16 ? 2 : 4;
  float* part = xs;                              // [chunks][C]: part k sums producers k, k + chunks, ...
  float* u = xs + chunks * C;                    // [C]
  const long hbytes = (long)nrows * R * isz;
  char* stage = reinterpret_cast<char*>(xs + ((chunks * C + C + 3) & ~3));
  const bool staged = hbytes % 16 == 0 && hstride % 16 == 0 && (reinterpret_cast<uintptr_t>(b0) & 15) == 0 &&
                      stage + halves * hbytes <= reinterpret_cast<char*>(xs + MEGAVM_MAX_K);
  consumer_sync();                               // every warp is done with xs
  if (staged)
    for (int hf = 0; hf < halves; ++hf)
      for (long o = 16L * tid; o < hbytes; o += 16L * NCT) cp_async16(stage + hf * hbytes + o, b0 + hf * hstride + o);
  for (int i = tid; i < chunks * C; i += NCT) {
    const long col = col0 + i % C;
    float v0 = 0.f, v1 = 0.f;                    // two chains
    for (int t = i / C; t < T; t += LORA_LOADS * chunks) {
      uint64_t wd[LORA_LOADS];                   // every load of the group in flight before the first settles
#pragma unroll
      for (int k = 0; k < LORA_LOADS; ++k) {
        const int tk = t + k * chunks;
        wd[k] = tk < T ? act_word(U, utag != 0, (long)tk * ncol + col) : 0ull;
      }
#pragma unroll
      for (int k = 0; k < LORA_LOADS; ++k) {
        const int tk = t + k * chunks;
        if (tk < T)
          (k & 1 ? v1 : v0) += utag ? settle(*a, block, qpos, ins, ub, U, (long)tk * ncol + col, utag, wd[k])
                                    : __uint_as_float((uint32_t)wd[k]);
      }
    }
    part[i] = v0 + v1;
  }
  if (utag) tag_acquire();
  if (staged) cp_async_wait_all();
  consumer_sync();
  for (int j = tid; j < C; j += NCT) {
    float v = 0.f;
    for (int k = 0; k < chunks; ++k) v += part[k * C + j];
    u[j] = v * s;
  }
  consumer_sync();
  for (int hf = 0; hf < halves; ++hf) {
    const char* b = staged ? stage + hf * hbytes : b0 + hf * hstride;
    if (bf16)
      lora_rows_t(tid, (const __nv_bfloat16*)b, R, u + hf * R, nrows, acc + hf * ACC_ROWS);
    else
      lora_rows_t(tid, (const float*)b, R, u + hf * R, nrows, acc + hf * ACC_ROWS);
  }
  consumer_sync();
}

// The consumer side, for `halves` groups of nrows rows (gate, then up: their B rows half apart, their
// columns of U side by side, their sums ACC_ROWS apart in acc):
// acc[r] += sum_j B[id, brow0 + r, j] u[j], u[j] = s * sum_t U[t, col0 + j]. Called once the GEMV is
// done with xs, which holds u; ends with a consumer_sync.
__device__ bool lora_add(mvm_ctx& c, int ub, int bb, int id, int col0, int row0, int nrows, float s, int halves) {
  if (ub < 0) return true;
  if (!lora_id_ok(c, id, bb)) return false;
  if (id == 0) return true;
  const mvm_buffer_t& ui = bufinfo(c, ub);
  const mvm_buffer_t& bi = bufinfo(c, bb);
  const int R = (int)bi.shape[2], isz = elem_bytes(bi.dtype);
  const long rows = bi.shape[1] / halves;
  const char* b0 = (const char*)buf(c, bb) + (((long)id * bi.shape[1] + row0) * R) * isz;
  lora_add_rows(&c.a, c.ins, c.block, c.qpos, buf_tagged(c, ub) ? step_tag(c) : 0u, ub, (const float*)buf(c, ub),
                (int)ui.shape[0], (int)ui.shape[1], col0, b0, rows * R * isz, bi.dtype == MVM_BF16, R, nrows, s,
                halves, c.tid, c.s.xs, c.s.acc);
  return true;
}
