// ATTN_PARTIAL: one (KV head, KV block) of decode attention -> (m, l, acc) per query head of the group.
#pragma once
#include "device.cuh"

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
template <> __device__ __forceinline__ void row8<float>::get(float (&v)[8]) const {
  const float* f = reinterpret_cast<const float*>(&r[0]);
#pragma unroll
  for (int i = 0; i < 8; ++i) v[i] = f[i];
}

// ---- the K/V history through shared memory ---------------------------------------------------
// Rows before this step's position were written by an earlier step or launch and cannot change in
// this step, so two bulk copies (K rows, V rows) bring them into shared memory at float hist_at of xs,
// past the partial's own scratch. The pre-wait hook issues them BEFORE the partial's wait once this
// block has passed a wait in this step (which orders them after the previous step's writes); their
// HBM latency then hides behind the wait. The step's own row (position pos) is read after the wait.
// A history longer than hist_rows is read from L2 instead (params computed by attention.py).

// The first key the partial sees at position pos: its block's first, or the sliding window's.
__device__ __forceinline__ int attn_first_key(const mvm_ctx& c, int pos) {
  using Op = ATTN_PARTIAL;
  const int lo = Op::block(c.ins) * Op::block_size(c.ins), window = Op::window(c.ins);
  return window > 0 ? max(lo, pos - window + 1) : lo;
}

// Rows [first key, min(block end, pos)) of the partial's block, when they fit; else 0.
__device__ __forceinline__ int attn_hist_rows(const mvm_ctx& c, int pos) {
  using Op = ATTN_PARTIAL;
  if (!HAS_RING) return 0;
  const long cap = bufinfo(c, Op::k_cache(c.ins)).shape[1];
  const int b = Op::block(c.ins), bs = Op::block_size(c.ins);
  if (pos < 0 || pos >= cap || (c.a.flags & MVM_FLAG_NO_ATTN_HISTORY)) return 0;
  const int hist = max(0, min((b + 1) * bs, pos) - attn_first_key(c, pos));
  return hist <= Op::hist_rows(c.ins) ? hist : 0;
}

// All consumer threads call this; thread 0 issues the copies. Sets c.attn_hist.
__device__ void attn_prefetch(mvm_ctx& c) {
  using Op = ATTN_PARTIAL;
  const int pos = input_pos(c);
  const int hist = attn_hist_rows(c, pos);
  c.attn_hist = hist;
  if (hist == 0 || c.tid != 0) return;
  const mvm_buffer_t& kinfo = bufinfo(c, Op::k_cache(c.ins));
  const int hd = (int)kinfo.shape[2], isz = kinfo.dtype == MVM_BF16 ? 2 : 4;
  const int h = Op::kv_head(c.ins), lo = attn_first_key(c, pos);
  const uint32_t bytes = (uint32_t)hist * hd * isz;
  const long row0 = ((long)h * kinfo.shape[1] + lo) * hd * isz;
  unsigned char* dst = reinterpret_cast<unsigned char*>(c.s.xs + Op::hist_at(c.ins));
  const uint32_t bar = smem_addr(&c.s.attn_bar);
  fence_proxy_async();                           // earlier accesses (shared memory, other SMs' cache writes) first
  mbar_expect_bytes(bar, 2 * bytes);
  bulk_copy(smem_addr(dst), (const unsigned char*)buf(c, Op::k_cache(c.ins)) + row0, bytes, bar);
  bulk_copy(smem_addr(dst + bytes), (const unsigned char*)buf(c, Op::v_cache(c.ins)) + row0, bytes, bar);
}

// The pre-wait hook: the history copies, once a wait of this step has passed on this block.
__device__ __forceinline__ void attn_prewait(mvm_ctx& c) {
  if (c.synced) attn_prefetch(c);
}

template <typename T> __device__ __forceinline__ float ld_cg1(const T* p);
template <> __device__ __forceinline__ float ld_cg1<float>(const float* p) { return __ldcg(p); }
template <> __device__ __forceinline__ float ld_cg1<__nv_bfloat16>(const __nv_bfloat16* p) {
  return __uint_as_float(((uint32_t)__ldcg(reinterpret_cast<const unsigned short*>(p))) << 16);
}

// Short loops over shared memory: the partial runs once per layer per SM, so its code is fetched
// cold every time and must stay small; rows [0, nh) are in shared memory (the history copies), and
// so is this step's own row where it fits (tail_shared); otherwise the rest come from L2.
template <typename T>
__device__ void attn_partial_impl(mvm_ctx& c, const float* q, const T* kc, const T* vc, float* part, int h,
                                  int b, int bs, int lo, float scale, int G, int hd, long cap, int nblk, int pos,
                                  int hist_at, int hist_rows) {
  const int W = hd + 2;
  float* out = part + ((long)h * nblk + b) * G * W;
  const int hi = min((b + 1) * bs, pos + 1);
  if (hi <= lo) {
    for (int i = c.tid; i < G * W; i += NCT) out[i] = (i % W == 0) ? -INFINITY : 0.f;
    return;
  }
  const int n = hi - lo;
  float* qs = c.s.xs;              // [G][hd], pre-scaled
  float* sc = qs + G * hd;         // [G][n] scores, then exp(score - max)
  const T* kh = kc + ((long)h * cap + lo) * hd;
  const T* vh = vc + ((long)h * cap + lo) * hd;
  const int nh = c.attn_hist;
  const T* ks = reinterpret_cast<const T*>(c.s.xs + hist_at);
  const T* vs = ks + (long)nh * hd;
  // this step's own row, the one row past the history copy, comes into shared memory together with q
  // (one round trip), so the loops below read shared memory only
  T* tail = const_cast<T*>(ks) + 2L * nh * hd;   // [K row][V row]
  const bool tail_shared = n - nh == 1 && !(c.a.flags & MVM_FLAG_NO_ATTN_HISTORY) && nh + 1 <= hist_rows;
  for (int i = c.tid; i < G * hd; i += NCT) qs[i] = __ldcg(q + (long)h * G * hd + i) * scale;
  if (tail_shared) {
    const int P = hd * (int)sizeof(T) / 16;      // 16-byte pieces per row (hd is a multiple of 8)
    for (int i = c.tid; i < 2 * P; i += NCT) {
      const uint4* src = reinterpret_cast<const uint4*>((i < P ? kh : vh) + (long)(n - 1) * hd);
      reinterpret_cast<uint4*>(tail)[i] = __ldcg(src + i % P);
    }
  }
  if (nh > 0) {                                  // the history copies have landed
    const uint32_t bar = smem_addr(&c.s.attn_bar);
    while (!mbar_try_wait(bar, c.attn_phase)) {}
    c.attn_phase ^= 1u;
  }
  consumer_sync();
  // scores. When a K row is P = hd / 8 pieces with P a power of two up to 32 (hd 64: 8, hd 128: 16), P
  // lanes share a key: each loads its piece once and meets it with the same piece of every query head's
  // q, and the P sums meet in a butterfly; a warp covers 32 / P consecutive keys (consecutive shared
  // memory) at a time. Otherwise one (key, head) pair per thread, the pieces of a row visited from a
  // key-dependent start so the keys of a warp read different shared-memory banks.
  const int pieces = hd / 8;
  if ((pieces & (pieces - 1)) == 0 && pieces <= 32) {
    const int p = c.lane & (pieces - 1), kpw = 32 / pieces;
    for (int j0 = c.warp * kpw; j0 < n; j0 += NCW * kpw) {   // the whole warp iterates: it shuffles
      const int j = j0 + c.lane / pieces;
      float kv[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
      if (j < n) {
        row8<T> r;
        if (j < nh) r.load_shared(ks + (long)j * hd + p * 8);
        else if (tail_shared) r.load_shared(tail + p * 8);
        else r.load(kh + (long)j * hd + p * 8);
        r.get(kv);
      }
      for (int g0 = 0; g0 < G; g0 += 4) {          // four heads at once: four independent butterflies
        float s[4];
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          const float* qg = qs + min(g0 + k, G - 1) * hd + p * 8;
          const float4 qa = *reinterpret_cast<const float4*>(qg), qb = *reinterpret_cast<const float4*>(qg + 4);
          float a = qa.x * kv[0], b = qb.x * kv[4];
          a = fmaf(qa.y, kv[1], a); b = fmaf(qb.y, kv[5], b);
          a = fmaf(qa.z, kv[2], a); b = fmaf(qb.z, kv[6], b);
          a = fmaf(qa.w, kv[3], a); b = fmaf(qb.w, kv[7], b);
          s[k] = a + b;
        }
        for (int o = pieces / 2; o > 0; o >>= 1)
#pragma unroll
          for (int k = 0; k < 4; ++k) s[k] += __shfl_xor_sync(0xffffffffu, s[k], o);
        if (p == 0 && j < n)
#pragma unroll
          for (int k = 0; k < 4; ++k)
            if (g0 + k < G) sc[(g0 + k) * n + j] = s[k];
      }
    }
  } else {
    for (int i = c.tid; i < n * G; i += NCT) {
      const int j = i / G, g = i % G;
      const float* qg = qs + g * hd;
      float s = 0.f;
      for (int p0 = 0; p0 < pieces; ++p0) {
        const int p = (p0 + j) % pieces;
        row8<T> r;
        if (j < nh) r.load_shared(ks + (long)j * hd + p * 8);
        else if (tail_shared) r.load_shared(tail + p * 8);
        else r.load(kh + (long)j * hd + p * 8);
        float kv[8];
        r.get(kv);
#pragma unroll
        for (int e = 0; e < 8; ++e) s = fmaf(qg[p * 8 + e], kv[e], s);
      }
      sc[g * n + j] = s;
    }
  }
  consumer_sync();
  for (int g = c.warp; g < G; g += NCW) {
    float m = -INFINITY;
    for (int j = c.lane; j < n; j += 32) m = fmaxf(m, sc[g * n + j]);
    m = warp_max(m);
    float l = 0.f;
    for (int j = c.lane; j < n; j += 32) {
      const float e = expf(sc[g * n + j] - m);
      sc[g * n + j] = e;
      l += e;
    }
    l = warp_sum(l);
    if (c.lane == 0) { out[g * W] = m; out[g * W + 1] = l; }
  }
  consumer_sync();
  // values, one (head, element) output per thread at a time, keys in order
  for (int i = c.tid; i < G * hd; i += NCT) {
    const int g = i / hd, d = i % hd;
    const float* pg = sc + g * n;
    float acc = 0.f;
    for (int j = 0; j < nh; ++j) acc = fmaf(pg[j], to_f(vs[(long)j * hd + d]), acc);
    for (int j = nh; j < n; ++j) acc = fmaf(pg[j], tail_shared ? to_f(tail[hd + d]) : ld_cg1(vh + (long)j * hd + d), acc);
    out[g * W + 2 + d] = acc;
  }
}

__device__ bool op_attn_partial(mvm_ctx& c) {
  using Op = ATTN_PARTIAL;
  const int kb = Op::k_cache(c.ins), vb = Op::v_cache(c.ins), pb = Op::part(c.ins);
  const mvm_buffer_t& kinfo = bufinfo(c, kb);
  const mvm_buffer_t& pinfo = bufinfo(c, pb);
  const int pos = input_pos(c);
  const long cap = kinfo.shape[1];
  if (!input_in_range(c, pos, cap)) return false;
  const float* q = (const float*)buf(c, Op::q(c.ins));
  const int G = (int)pinfo.shape[2], hd = (int)kinfo.shape[2], nblk = (int)pinfo.shape[1];
  if (c.attn_hist < 0) attn_prefetch(c);         // not issued before the wait: issue it now
  consumer_sync();                               // (thread 0's copies are armed before anyone waits)
  const int h = Op::kv_head(c.ins), b = Op::block(c.ins), bs = Op::block_size(c.ins), lo = attn_first_key(c, pos);
  const int at = Op::hist_at(c.ins), rows = Op::hist_rows(c.ins);
  if (kinfo.dtype == MVM_BF16)
    attn_partial_impl(c, q, (const __nv_bfloat16*)buf(c, kb), (const __nv_bfloat16*)buf(c, vb), (float*)buf(c, pb), h,
                      b, bs, lo, Op::scale(c.ins), G, hd, cap, nblk, pos, at, rows);
  else
    attn_partial_impl(c, q, (const float*)buf(c, kb), (const float*)buf(c, vb), (float*)buf(c, pb), h, b, bs, lo,
                      Op::scale(c.ins), G, hd, cap, nblk, pos, at, rows);
  c.attn_hist = -1;
  return true;
}
