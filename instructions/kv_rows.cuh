// The K/V rows an attention partial reads (attn_partial.cuh): 8 elements at a time, from a ring stage,
// shared memory or L2, and which lane meets which piece of a row.
#pragma once
#include "codes.cuh"

// 8 elements of a K row: from shared memory, or through L2 (rows appended in this launch are never
// stale in L1).
template <typename T> struct row8 {
  static constexpr int N = sizeof(T) / 2;      // uint4s per 8 elements: 1 (bf16) or 2 (f32)
  uint4 r[N];
  __device__ __forceinline__ void load(const T* p) {
#pragma unroll
    for (int i = 0; i < N; ++i) r[i] = __ldcg(reinterpret_cast<const uint4*>(p) + i);
  }
  __device__ __forceinline__ void load_shared(const T* p) {
#pragma unroll
    for (int i = 0; i < N; ++i) r[i] = reinterpret_cast<const uint4*>(p)[i];
  }
  __device__ __forceinline__ void get(float (&v)[8]) const;
};
template <> __device__ __forceinline__ void row8<__nv_bfloat16>::get(float (&v)[8]) const {
  const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&r[0]);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 f = __bfloat1622float2(h[i]);
    v[2 * i] = f.x;
    v[2 * i + 1] = f.y;
  }
}
// 8 e4m3 codes (a quantized cache, instructions/kv_quant.py): 8 bytes; the row's scale is applied by
// kv_rows::load.
template <> struct row8<mvm_e4m3> {
  uint2 r;
  __device__ __forceinline__ void load(const mvm_e4m3* p) { r = __ldcg(reinterpret_cast<const uint2*>(p)); }
  __device__ __forceinline__ void load_shared(const mvm_e4m3* p) { r = *reinterpret_cast<const uint2*>(p); }
  __device__ __forceinline__ void get(float (&v)[8]) const {
    const float4 a = e4m3x4(r.x), b = e4m3x4(r.y);
    v[0] = a.x; v[1] = a.y; v[2] = a.z; v[3] = a.w;
    v[4] = b.x; v[5] = b.y; v[6] = b.z; v[7] = b.w;
  }
};
template <> __device__ __forceinline__ void row8<float>::get(float (&v)[8]) const {
  const float* f = reinterpret_cast<const float*>(&r[0]);
#pragma unroll
  for (int i = 0; i < 8; ++i) v[i] = f[i];
}

// ---- the K/V rows before this step's position ---------------------------------------------
// Rows before pos were written by an earlier step or launch and cannot change in this step. The
// loader streams them through the ring like weights (the partial's two history streams: K rows, then
// V rows, in stages of whole rows), after the wait that covers their writers a step earlier, so they
// arrive ahead of the partial's wait. Without the ring (no ring, the direct-loads or no-history
// ablation, or a window the stream cannot name) they are read from L2 after the wait. The step's own
// row (position pos) is written by this step's K/V tiles: it comes from L2 into shared memory after
// the wait, together with q.

// What the partial needs of its block, by value (it runs out of line: inlined, its registers made the
// main loop spill); the ring position goes in and comes back.
struct attn_view {
  mvm_smem* s;
  int tid, warp, lane;
  int stage;
  uint32_t phase;
  uint32_t tag;                                  // non-zero: the partials are tagged words of this tag
  // tagged inputs (instructions/tagged.cuh): q (qb, when qt), this step's K and V rows (krow, vrow:
  // null when the partial takes its own row from the cache), and what a poll's timeout dump names
  const mvm_args_t* a;
  const mvm_instr_t* ins;
  uint32_t qpos, step_tag;
  int qb, krb, vrb;
  bool qt;
  const float* krow;
  const float* vrow;
  bool norm;                                     // one block a KV head: write the attention output, acc / l
};

// Where the history rows of one pass (K or V) are: chunk k holds rows [k R, min(n, (k + 1) R)), in
// ring stage order (wait for it, release it once this warp is done), or in the cache (L2).
template <typename T> struct kv_pass {
  const T* rows;                                 // the cache's row of key 0 (the L2 path)
  int R, hd;                                     // rows per chunk (whole rows in a ring stage), row length
  bool ring;
  __device__ __forceinline__ const T* chunk(const attn_view& c, int k) const {
    if (!ring) return rows + (long)k * R * hd;
    while (!mbar_try_wait(smem_addr(&c.s->full[c.stage]), c.phase)) {}
    return reinterpret_cast<const T*>(c.s->ring[c.stage]);
  }
  __device__ __forceinline__ void done(attn_view& c) const {
    if (!ring) return;
    __syncwarp();
    if (c.lane == 0) mbar_arrive(smem_addr(&c.s->empty[c.stage]));
    if (++c.stage == STAGES) { c.stage = 0; c.phase ^= 1u; }
  }
};

// The rows of one call of attn_scores or attn_values: key j (j0 <= j, j != jo) at rows + (j - j0) hd,
// in shared memory (a ring stage) or not (L2); key jo, the step's own row, at own in shared memory. Key
// j is cache row t0 + j: its 8-element piece p lies in the 16-byte chunk swizzled by kv_xor(t0 + j, sw)
// (device.cuh: kv_swizzle): piece p ^ that for bf16 rows, p ^ 2 that for e4m3 (two pieces a chunk).
// e4m3 rows are codes: key j's values are its codes times scale[j] (the cache's scale of row t0 + j); e2m1
// rows (two codes a byte, not swizzled) also times their block scales.
template <typename T> struct kv_rows {
  const T* rows;
  bool shared;
  int j0;
  const T* own;
  int jo;
  int t0, sw;
  const float* scale = nullptr;
  const uint8_t* bscale = nullptr;               // e2m1 rows: key j's e4m3 block scales at bscale[j hd / 16 ..]
  // the tensor-core path's scales of this pass in shared memory (attn_scales.cuh: pass_scales, which
  // multiplies them as the loops take them): key j's at shared address ss + 4 (j - j0), an e2m1 key's block
  // scales as words from ss + 4 (sk + (j - j0) bw)
  uint32_t ss = 0;
  int sk = 0;
  __device__ __forceinline__ float staged_scale(int j) const { return __uint_as_float(lds32(ss + 4 * (j - j0))); }
  __device__ __forceinline__ uint32_t staged_bword(int j, int w, int bw) const {
    return lds32(ss + 4 * (sk + (j - j0) * bw + w));
  }
  __device__ __forceinline__ int piece(int j, int p) const { return p ^ (kv_xor(t0 + j, sw) << (sizeof(T) == 1)); }
  __device__ __forceinline__ void load(int j, int hd, int p, float (&v)[8]) const {
    if constexpr (std::is_same<T, mvm_e2m1kv>::value) {   // 8 codes (4 bytes) of one block of 16, not swizzled
      const uint8_t* at = j == jo ? reinterpret_cast<const uint8_t*>(own) + 4 * p
                                  : reinterpret_cast<const uint8_t*>(rows) + (long)(j - j0) * (hd / 2) + 4 * p;
      const uint32_t u = j != jo && !shared ? __ldcg(reinterpret_cast<const unsigned int*>(at))
                                            : *reinterpret_cast<const uint32_t*>(at);
      const float s = __half2float(__half(__nv_cvt_fp8_to_halfraw(__ldcg(bscale + (long)j * (hd / 16) + p / 2),
                                                                  __NV_E4M3))) * __ldcg(scale + j) * 16384.f;
#pragma unroll
      for (int k = 0; k < 4; ++k) {               // codes k and k + 4 of the word, times 2^-14
        const uint32_t h = e2m1x2_f16x2_raw(u >> (4 * k));
        const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&h));
        v[k] = f.x * s;
        v[k + 4] = f.y * s;
      }
    } else {
      row8<T> r;
      const int at = piece(j, p) * 8;
      if (j == jo) r.load_shared(own + at);
      else if (shared) r.load_shared(rows + (long)(j - j0) * hd + at);
      else r.load(rows + (long)(j - j0) * hd + at);
      r.get(v);
      if constexpr (sizeof(T) == 1) {
        const float s = __ldcg(scale + j);
#pragma unroll
        for (int e = 0; e < 8; ++e) v[e] *= s;
      }
    }
  }
};

// Lanes meet a K or V row in pieces of 8 elements (16 bytes in bf16): P = hd / 8 pieces padded to a power of two
// (lanes past hd / 8 hold zeros), P lanes per key, 32 / P consecutive keys per warp.
struct attn_lanes {
  int P, p, t, kpw;                              // lanes per key, this lane's piece, its key, keys per warp
  bool on;                                       // the piece is inside the row
  __device__ __forceinline__ attn_lanes(int lane, int hd) {
    P = 1;
    while (P < hd / 8) P *= 2;
    p = lane & (P - 1);
    t = lane / P;
    kpw = 32 / P;
    on = p < hd / 8;
  }
};
