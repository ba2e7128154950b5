// ATTN_PARTIAL: one (KV head, KV block) of decode attention -> (m, l, acc) per query head of the group.
#pragma once
#include <type_traits>
#include "attn_cores.cuh"
#include "attn_scales.cuh"

// Query heads a KV head: the partials' third axis, or (one block writing the attention output, 1-D) q's
// length over the cache's heads and head_dim.
__device__ __forceinline__ int attn_group(const mvm_args_t& a, const mvm_instr_t* ins, const mvm_buffer_t& pinfo,
                                          const mvm_buffer_t& kinfo) {
  if (pinfo.ndim == 4) return (int)pinfo.shape[2];
  return (int)(a.buffers[ATTN_PARTIAL::q(ins)].shape[0] / (kinfo.shape[0] * kinfo.shape[2]));
}

// The first key the partial sees at position pos: its block's first, or the sliding window's.
__device__ __forceinline__ int attn_first_key(const mvm_ctx& c, int pos) {
  using Op = ATTN_PARTIAL;
  const int lo = Op::block(c.ins) * Op::block_size(c.ins), window = Op::window(c.ins);
  return window > 0 ? max(lo, pos - window + 1) : lo;
}

// Before the wait: a quantized cache's scales of the block's keys into L2 (one bulk prefetch each for K
// and V, and for an e2m1 cache's block scales), so the tiles' scale loads meet L2, not DRAM. None for
// other caches (scale slots empty).
__device__ __forceinline__ void scales_prewait(mvm_ctx& c, int kb, int ks, int vs, int kbs, int vbs, int h, int b,
                                               int bs) {
  if (ks < 0 || c.tid != 0) return;
  const long cap = bufinfo(c, kb).shape[1], k0 = min((long)b * bs, cap), k1 = min((long)(b + 1) * bs, cap);
  prefetch_l2((const float*)buf(c, ks) + h * cap + k0, (uint64_t)(k1 - k0) * 4);
  prefetch_l2((const float*)buf(c, vs) + h * cap + k0, (uint64_t)(k1 - k0) * 4);
  if (kbs < 0) return;
  const long nb = bufinfo(c, kbs).shape[2];      // bytes a key
  prefetch_l2((const uint8_t*)buf(c, kbs) + (h * cap + k0) * nb, (uint64_t)((k1 - k0) * nb));
  prefetch_l2((const uint8_t*)buf(c, vbs) + (h * cap + k0) * nb, (uint64_t)((k1 - k0) * nb));
}

// This step's K and V rows from the k/v tiles' tagged copies (k_row, v_row) into own, as the cache
// holds them: rounded to its dtype, swizzled at position pos (kv_store). e4m3 caches take none.
template <typename T>
__device__ __forceinline__ void own_rows(const attn_view& c, T* own, int h, int hd, int pos) {
  const int sw = kv_xor(pos, kv_swizzle<T>(hd)) << 3;
  for (int i = c.tid; i < 2 * hd; i += NCT) {
    const bool k = i < hd;
    const int d = k ? i : i - hd;
    own[(k ? 0 : hd) + (d ^ sw)] = from_f<T>(poll_value(*c.a, blockIdx.x, c.qpos, c.ins, k ? c.krb : c.vrb,
                                                        k ? c.krow : c.vrow, (long)h * hd + d, c.step_tag));
  }
}
template <>
__device__ __forceinline__ void own_rows<mvm_e4m3>(const attn_view&, mvm_e4m3*, int, int, int) {}
template <>
__device__ __forceinline__ void own_rows<mvm_e2m1kv>(const attn_view&, mvm_e2m1kv*, int, int, int) {}

// Scratch (attention.py: partial_scratch): qs [G][hd] pre-scaled | sc [G][bs] scores, then the key
// splits' sums [KS][G][hd + 2] | mx [G] | the step's own K and V rows (16-byte aligned). HD > 0: the
// tensor-core path (attn_mma.cuh; bf16 rows in ring stages, head_dim HD, G <= 8), the warps' key tiles
// as the splits.
template <typename T, int GB, int HD = 0>
__device__ __forceinline__ int2 attn_partial_impl(attn_view c, const float* q, const T* kc, const T* vc, float* part, int h,
                                  int b, int bs, int lo, float scale, int G, int hd, long cap, int nblk, int pos,
                                  bool ring, const float* ksc, const float* vsc) {
  const int W = hd + 2, GH = G * hd;
  // tagged: 8-byte words; norm: the head's rows of the attention output
  float* out = part + (c.norm ? (long)h * GH : ((long)h * nblk + b) * G * W) * (c.tag ? 2 : 1);
  const int hi = min((b + 1) * bs, pos + 1);
  if (hi <= lo) {
    for (int i = c.tid; i < (c.norm ? GH : G * W); i += NCT)
      act_store(out, c.tag != 0, i, (i % W == 0 && !c.norm) ? -INFINITY : 0.f, c.tag);
    return make_int2(c.stage, (int)c.phase);
  }
  const int n = hi - lo, nh = max(0, min((b + 1) * bs, pos) - lo);    // keys; keys before pos
  const value_split<GB> vs(c.warp, G);
  const int KW = min(NCW, MEGAVM_ATTN_KEY_SPLITS);                     // the tensor-core path's splits
  // head_dim 256 (bf16 rows): a warp sums a quarter of it, four warps a key split (attention.py: mma_shape)
  constexpr int HV = HD > 128 ? 64 : HD;
  const int VKS = KW / (HD > 0 ? HD / HV : 1);
  const int KS = HD > 0 ? VKS : vs.KS;
  float* qs = c.s->xs;
  float* sc = qs + GH;
  int* mx = reinterpret_cast<int*>(sc + max(G * bs, KS * G * W));
  const int own_at = (GH + (reinterpret_cast<float*>(mx) - sc) + G + 3) & ~3;
  T* own = reinterpret_cast<T*>(c.s->xs + own_at);
  const int ru = kv_units<T>(hd);               // a row's length in T (e2m1: two codes a byte)
  const T* kh = kc + ((long)h * cap + lo) * ru;
  const T* vh = vc + ((long)h * cap + lo) * ru;
  const float* k_sc = ksc ? ksc + (long)h * cap + lo : nullptr;   // coded rows: each key's scale
  const float* v_sc = vsc ? vsc + (long)h * cap + lo : nullptr;
  const uint8_t *k_bs = nullptr, *v_bs = nullptr;                  // e2m1 rows: each key's block scales
  if constexpr (std::is_same<T, mvm_e2m1kv>::value) {
    k_bs = (const uint8_t*)c.a->ptrs[ATTN_PARTIAL::k_bscale(c.ins)] + ((long)h * cap + lo) * (hd / 16);
    v_bs = (const uint8_t*)c.a->ptrs[ATTN_PARTIAL::v_bscale(c.ins)] + ((long)h * cap + lo) * (hd / 16);
  }
  const int R = ring ? STAGE_BYTES / (ru * (int)sizeof(T)) : max(nh, 1);
  const int chunks = (nh + R - 1) / R;
  // passes over the history chunks; the last also takes the own row (key nh, when the block holds it)
  const int passes = max(chunks, 1);
  // a quantized cache on tensor cores: the scales of the first two passes on their way (pass_scales)
  constexpr bool STAGED = HD > 0 && sizeof(T) == 1 && (!std::is_same<T, mvm_e2m1kv>::value || E2M1_STAGED<HD>);
  pass_scales<T, STAGED ? HD : 64> ps{k_sc, v_sc, k_bs, v_bs, passes, R, n, c.tid,
                                      smem_addr(c.s->xs + own_at + 2 * hd)};
  if constexpr (STAGED) ps.begin();
  // q four elements a thread, each four in one poll (two 16-byte loads): one round trip for a thread's
  // words once they have landed, where a word at a time took one for each (G x hd / NCT of them)
  for (int i = 4 * c.tid; i < GH; i += 4 * NCT) {
    const float4 v = c.qt ? poll4_late(*c.a, blockIdx.x, c.qpos, c.ins, c.qb, reinterpret_cast<const uint64_t*>(q),
                                       (long)h * GH + i, c.step_tag)
                          : __ldcg(reinterpret_cast<const float4*>(q + (long)h * GH + i));
    *reinterpret_cast<float4*>(qs + i) = make_float4(v.x * scale, v.y * scale, v.z * scale, v.w * scale);
  }
  for (int i = c.tid; i < G; i += NCT) mx[i] = ordered(-INFINITY);
  if (n > nh && c.krow) {
    own_rows(c, own, h, hd, pos);
  } else if (n > nh) {
    const int P = ru * (int)sizeof(T) / 16;      // 16-byte pieces per row (hd is a multiple of 8; e2m1: of 32)
    for (int i = c.tid; i < 2 * P; i += NCT) {
      const uint4* src = reinterpret_cast<const uint4*>((i < P ? kh : vh) + (long)nh * ru);
      reinterpret_cast<uint4*>(own)[i] = __ldcg(src + i % P);
    }
  }
  if constexpr (STAGED) ps.ready();
  consumer_sync();
  const int sw = kv_swizzle<T>(hd);
  kv_pass<T> kp{kh, R, ru, ring};
  if constexpr (HD > 0) {
    const std::conditional_t<std::is_same<T, mvm_e2m1kv>::value, q_frags_e2m1<HD>,
                             std::conditional_t<sizeof(T) == 1, q_frags_e4m3<HD>, q_frags<HD>>> qf(qs, c.lane, G);
    float top = -INFINITY;
    for (int k = 0; k < passes; ++k) {
      const kv_rows<T> rows{k < chunks ? kp.chunk(c, k) : nullptr, ring, k * R, (const T*)own, nh, lo, sw, k_sc, k_bs,
                            ps.buffer(k), ps.SK};
      if (MVM_PROBE_ATTN_CUT != 1 && c.warp < KW)
        attn_scores_mma<HD>(c, qf, sc, top, rows, k + 1 < passes ? (k + 1) * R : n, n, G, KW);
      if (k < chunks) kp.done(c);
      if constexpr (STAGED) ps.advance(k);
    }
    top = fmaxf(top, __shfl_xor_sync(0xffffffffu, top, 1));
    top = fmaxf(top, __shfl_xor_sync(0xffffffffu, top, 2));
    if (c.lane % 4 == 0 && c.lane / 4 < G && top > -INFINITY) atomicMax(mx + c.lane / 4, ordered(top));
  } else {
    for (int k = 0; k < passes; ++k) {
      const kv_rows<T> rows{k < chunks ? kp.chunk(c, k) : nullptr, ring, k * R, (const T*)own, nh, lo, sw, k_sc, k_bs};
      if (MVM_PROBE_ATTN_CUT != 1) attn_scores<T, GB>(c, qs, sc, mx, rows, k + 1 < passes ? (k + 1) * R : n, n, G, hd);
      if (k < chunks) kp.done(c);
    }
  }
  consumer_sync();
  kv_pass<T> vp{vh, R, ru, ring};
  if constexpr (HD > 0) {
    const int g = c.lane / 4, t = c.lane % 4;
    const float m = unordered(mx[min(g, G - 1)]);
    const int vks = c.warp % VKS, dp = c.warp / VKS;     // this warp's key split, and its part of head_dim
    float acc[HV / 8][4], w = 0.f;
#pragma unroll
    for (int nt = 0; nt < HV / 8; ++nt) acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.f;
    for (int k = 0; k < passes; ++k) {
      const kv_rows<T> rows{k < chunks ? vp.chunk(c, k) : nullptr, ring, k * R, (const T*)own + ru, nh, lo, sw, v_sc, v_bs,
                            ps.buffer(passes + k), ps.SK};
      if (MVM_PROBE_ATTN_CUT == 0 && c.warp < KW) {
        if constexpr (std::is_same<T, __nv_bfloat16>::value)
          attn_values_mma<HD, HV>(c, sc, m, acc, w, rows, k + 1 < passes ? (k + 1) * R : n, n, G, VKS, vks, dp * HV / 8);
        else
          attn_values_mma<HD>(c, sc, m, acc, w, rows, k + 1 < passes ? (k + 1) * R : n, n, G, KW);
      }
      if (k < chunks) vp.done(c);
      if constexpr (STAGED) ps.advance(passes + k);
    }
    // each key split's sums into [split][G][W] over the scores (all read by now)
    w += __shfl_xor_sync(0xffffffffu, w, 1);
    w += __shfl_xor_sync(0xffffffffu, w, 2);
    consumer_sync();
    if (c.warp < KW && g < G) {
      float* red = sc + ((long)vks * G + g) * W + dp * HV;
      if (t == 0 && dp == 0) red[1] = w;
#pragma unroll
      for (int nt = 0; nt < HV / 8; ++nt) {       // e4m3: n-tile nt holds elements 16 (nt / 2) + 4t + nt % 2, + 2;
        if constexpr (std::is_same<T, mvm_e2m1kv>::value) {   // e2m1: 32 (nt / 4) + 8t + nt % 4, + 4
          const int e0 = 32 * (nt / 4) + 8 * t + nt % 4;
          red[2 + e0] = acc[nt][0] * (1.f / E2M1_VLIFT);
          red[2 + e0 + 4] = acc[nt][1] * (1.f / E2M1_VLIFT);
        } else {
          const int e0 = sizeof(T) == 1 ? 16 * (nt / 2) + 4 * t + nt % 2 : nt * 8 + 2 * t;
          if constexpr (std::is_same<T, __nv_bfloat16>::value) {   // hi and lo sums (attn_mma.cuh: mma_hilo)
            red[2 + e0] = hilo_sum(acc[nt], 0);
            red[3 + e0] = hilo_sum(acc[nt], 1);
          } else {
            const float lift = sizeof(T) == 1 ? 1.f / E4M3_LIFT : 1.f;
            red[2 + e0] = acc[nt][0] * lift;
            red[2 + e0 + (sizeof(T) == 1 ? 2 : 1)] = acc[nt][1] * lift;
          }
        }
      }
    }
  } else {
    const attn_lanes L(c.lane, hd);
    float m[GB], a[GB][8], w[GB];
#pragma unroll
    for (int k = 0; k < GB; ++k) {
      m[k] = unordered(mx[min(vs.g0 + k, G - 1)]);
      w[k] = 0.f;
#pragma unroll
      for (int e = 0; e < 8; ++e) a[k][e] = 0.f;
    }
    for (int k = 0; k < passes; ++k) {
      const kv_rows<T> rows{k < chunks ? vp.chunk(c, k) : nullptr, ring, k * R, (const T*)own + ru, nh, lo, sw, v_sc, v_bs};
      if (MVM_PROBE_ATTN_CUT == 0) attn_values<T, GB>(L, vs, sc, m, a, w, rows, k + 1 < passes ? (k + 1) * R : n, n, G, hd);
      if (k < chunks) vp.done(c);
    }
    // each split's sums over its lanes' keys, into [ks][G][W] over the scores (all read by now)
#pragma unroll
    for (int k = 0; k < GB; ++k) {
      for (int o = 16; o >= L.P; o >>= 1) {
        w[k] += __shfl_xor_sync(0xffffffffu, w[k], o);
#pragma unroll
        for (int e = 0; e < 8; ++e) a[k][e] += __shfl_xor_sync(0xffffffffu, a[k][e], o);
      }
    }
    consumer_sync();
    if (vs.ks < vs.KS && L.t == 0 && L.on) {
      float* red = sc + (long)vs.ks * G * W;
#pragma unroll
      for (int k = 0; k < GB; ++k) {
        const int g = vs.g0 + k;
        if (g >= G) break;
        if (L.p == 0) red[g * W + 1] = w[k];
#pragma unroll
        for (int e = 0; e < 8; ++e) red[g * W + 2 + L.p * 8 + e] = a[k][e];
      }
    }
  }
  consumer_sync();
  if (c.norm) {                                  // ATTN_COMBINE's arithmetic on one block: acc / l
    for (int i = c.tid; i < GH; i += NCT) {
      const int g = i / hd, e = 2 + i % hd;
      float l = 0.f, v = 0.f;
      for (int s = 0; s < KS; ++s) {
        l += sc[s * G * W + g * W + 1];
        v += sc[s * G * W + g * W + e];
      }
      act_store(out, c.tag != 0, i, v / l, c.tag);
    }
    return make_int2(c.stage, (int)c.phase);
  }
  for (int i = c.tid; i < G * W; i += NCT) {
    const int e = i % W;
    float v;
    if (e == 0) {
      v = unordered(mx[i / W]);
    } else {
      v = 0.f;
      for (int s = 0; s < KS; ++s) v += sc[s * G * W + i];
    }
    act_store(out, c.tag != 0, i, v, c.tag);
  }
  return make_int2(c.stage, (int)c.phase);
}

// The tensor-core path takes bf16 rows or e4m3 codes from ring stages, head_dim 64 or 128 and groups of at
// most 8 (attention.py: mma_shape, which sizes the scratch for its splits), and bf16 rows at head_dim 256
// (attn_mma_256); the CUDA-core path everything else.
__device__ __forceinline__ bool attn_mma(bool ring, int G, int hd) {
  return MVM_ATTN_MMA && ring && G <= 8 && (hd == 64 || hd == 128);
}
// bf16 rows also at head_dim 256 (four warps a key split, each summing a quarter of it; attn_values_mma)
// (A predicate of its own: folded into attn_mma as a flag, it made the main loop spill 16 / 48 bytes.)
__device__ __forceinline__ bool attn_mma_256(bool ring, int G, int hd) {
  return MVM_ATTN_MMA && ring && G <= 8 && hd == 256;
}

// bf16 rows of head_dim 256 on tensor cores, out of line (inlined into attn_partial_group, it made the
// main loop spill).
__device__ __noinline__ int2 attn_partial_256(attn_view v, const float* q, const __nv_bfloat16* kc, const __nv_bfloat16* vc,
                                              float* part, int h, int b, int bs, int lo, float scale, int G, int hd,
                                              long cap, int nblk, int pos, bool ring, const float* ks, const float* vs) {
  return attn_partial_impl<__nv_bfloat16, 4, 256>(v, q, kc, vc, part, h, b, bs, lo, scale, G, hd, cap, nblk, pos, ring, ks, vs);
}

// The instance for the shape: on tensor cores (MMA, where attn_mma or attn_mma_256 takes it) head_dim 64,
// 128 or 256 (bf16 only); on CUDA cores with the score lanes holding GB = 1, 2 or 4 heads' q at a time
// (attention.py: head_batch).
template <typename T, bool MMA>
__device__ __forceinline__ int2 attn_partial_shape(attn_view v, const float* q, const T* kc, const T* vc, float* part,
                                                   int h, int b, int bs, int lo, float scale, int G, int hd, long cap,
                                                   int nblk, int pos, bool ring, const float* ks, const float* vs) {
  if constexpr (MMA) {
    if (hd == 64) return attn_partial_impl<T, 4, 64>(v, q, kc, vc, part, h, b, bs, lo, scale, G, hd, cap, nblk, pos, ring, ks, vs);
    if constexpr (std::is_same<T, __nv_bfloat16>::value)
      if (hd == 256) return attn_partial_256(v, q, kc, vc, part, h, b, bs, lo, scale, G, hd, cap, nblk, pos, ring, ks, vs);
    return attn_partial_impl<T, 4, 128>(v, q, kc, vc, part, h, b, bs, lo, scale, G, hd, cap, nblk, pos, ring, ks, vs);
  } else {
    if (G <= 1) return attn_partial_impl<T, 1>(v, q, kc, vc, part, h, b, bs, lo, scale, G, hd, cap, nblk, pos, ring, ks, vs);
    if (G <= 2) return attn_partial_impl<T, 2>(v, q, kc, vc, part, h, b, bs, lo, scale, G, hd, cap, nblk, pos, ring, ks, vs);
    return attn_partial_impl<T, 4>(v, q, kc, vc, part, h, b, bs, lo, scale, G, hd, cap, nblk, pos, ring, ks, vs);
  }
}

// e4m3 codes on tensor cores (attn_mma_e4m3.cuh), out of line from attn_partial_group's e4m3 instance
// (inlined there, or called from a call site of their own in the main loop, they made the loop spill 84
// or 32 bytes).
__device__ __noinline__ int2 attn_partial_e4m3_mma(attn_view v, const float* q, const mvm_e4m3* kc, const mvm_e4m3* vc,
                                                   float* part, int h, int b, int bs, int lo, float scale, int G, int hd,
                                                   long cap, int nblk, int pos, bool ring, const float* ks,
                                                   const float* vs) {
  return attn_partial_shape<mvm_e4m3, true>(v, q, kc, vc, part, h, b, bs, lo, scale, G, hd, cap, nblk, pos, ring, ks, vs);
}

#if MVM_KV_E2M1
// The partial over e2m1 (NVFP4) rows: tensor cores where attn_mma takes the shape and head_dim is the
// build's (MVM_KV_E2M1 = 64 or 128: one instance a build, as each made the other's main loop spill more;
// attn_mma_e2m1.cuh), else the CUDA-core path. Out of line, from a call site that passes only the view:
// it reads its operands from the instruction itself (every other way tried made the main loop spill 80
// to 1000 bytes more).
__device__ __noinline__ int2 attn_partial_e2m1(attn_view v, int pos, bool ring) {
  using T = mvm_e2m1kv;
  using Op = ATTN_PARTIAL;
  const mvm_instr_t* ins = v.ins;
  const mvm_buffer_t& kinfo = v.a->buffers[Op::k_cache(ins)];
  const mvm_buffer_t& pinfo = v.a->buffers[Op::part(ins)];
  const float* q = (const float*)v.a->ptrs[Op::q(ins)];
  const T* kc = (const T*)v.a->ptrs[Op::k_cache(ins)];
  const T* vc = (const T*)v.a->ptrs[Op::v_cache(ins)];
  float* part = (float*)v.a->ptrs[Op::part(ins)];
  const float* ks = (const float*)v.a->ptrs[Op::k_scale(ins)];
  const float* vs = (const float*)v.a->ptrs[Op::v_scale(ins)];
  const int hd = (int)kinfo.shape[2];
  const int G = attn_group(*v.a, ins, pinfo, kinfo), nblk = pinfo.ndim == 4 ? (int)pinfo.shape[1] : 1;
  const long cap = kinfo.shape[1];
  const int h = Op::kv_head(ins), b = Op::block(ins), bs = Op::block_size(ins), window = Op::window(ins);
  const int lo = window > 0 ? max(b * bs, pos - window + 1) : b * bs;
  const float scale = Op::scale(ins);
#if MVM_KV_E2M1 == 64 || MVM_KV_E2M1 == 128                // the build's head_dim on tensor cores (core/limits.py)
  if (attn_mma(ring, G, hd) && hd == MVM_KV_E2M1)
    return attn_partial_impl<T, 4, MVM_KV_E2M1>(v, q, kc, vc, part, h, b, bs, lo, scale, G, hd, cap, nblk, pos, ring, ks, vs);
#endif
  return attn_partial_shape<T, false>(v, q, kc, vc, part, h, b, bs, lo, scale, G, hd, cap, nblk, pos, ring, ks, vs);
}
#endif

// The partial for a group of G query heads (attn_partial_shape). It runs out of line (inlined, its
// registers made the main loop spill).
template <typename T>
__device__ __noinline__ int2 attn_partial_group(attn_view v, const float* q, const T* kc, const T* vc, float* part,
                                                   int h, int b, int bs, int lo, float scale, int G, int hd, long cap,
                                                   int nblk, int pos, bool ring, const float* ks = nullptr,
                                                   const float* vs = nullptr) {
  if constexpr (sizeof(T) == 1) {
    if (attn_mma(ring, G, hd))
      return attn_partial_e4m3_mma(v, q, kc, vc, part, h, b, bs, lo, scale, G, hd, cap, nblk, pos, ring, ks, vs);
  }
  if constexpr (sizeof(T) == 2)                  // bf16 rows (head_dim 256 too)
    if (attn_mma(ring, G, hd) || attn_mma_256(ring, G, hd)) return attn_partial_shape<T, true>(v, q, kc, vc, part, h, b, bs, lo, scale, G, hd, cap, nblk, pos, ring, ks, vs);
  return attn_partial_shape<T, false>(v, q, kc, vc, part, h, b, bs, lo, scale, G, hd, cap, nblk, pos, ring, ks, vs);
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
  const int hd = (int)kinfo.shape[2];
  const int G = attn_group(c.a, c.ins, pinfo, kinfo), nblk = pinfo.ndim == 4 ? (int)pinfo.shape[1] : 1;
  const int h = Op::kv_head(c.ins), b = Op::block(c.ins), bs = Op::block_size(c.ins), lo = attn_first_key(c, pos);
  // the history streams came through the ring (loader.cuh walks them the same way)
  const bool ring = !c.direct && !(c.a.flags & MVM_FLAG_NO_ATTN_HISTORY) && c.ins->n_streams == 2;
  const int qb = Op::q(c.ins), krb = Op::k_row(c.ins), vrb = Op::v_row(c.ins);
  const attn_view v{&c.s, c.tid, c.warp, c.lane, c.stage, c.phase, buf_tagged(c, pb) ? step_tag(c) : 0u, &c.a, c.ins,
                    c.qpos, step_tag(c), qb, krb, vrb, buf_tagged(c, qb), krb >= 0 ? (const float*)buf(c, krb) : nullptr,
                    vrb >= 0 ? (const float*)buf(c, vrb) : nullptr, pinfo.ndim == 1};
  int2 rp;
  const float scale = Op::scale(c.ins);
  float* part = (float*)buf(c, pb);
#if MVM_KV_E2M1
  if (kinfo.dtype == MVM_E2M1)                    // codes, block scales and scales (instructions/kv_quant.py)
    rp = attn_partial_e2m1(v, pos, ring);
  else
#endif
  if (kinfo.dtype == MVM_F8E4M3)                  // codes and their scales
    rp = attn_partial_group(v, q, (const mvm_e4m3*)buf(c, kb), (const mvm_e4m3*)buf(c, vb), part, h, b, bs, lo, scale,
                            G, hd, cap, nblk, pos, ring, (const float*)buf(c, Op::k_scale(c.ins)),
                            (const float*)buf(c, Op::v_scale(c.ins)));
  else if (kinfo.dtype == MVM_BF16)
    rp = attn_partial_group(v, q, (const __nv_bfloat16*)buf(c, kb), (const __nv_bfloat16*)buf(c, vb), part, h, b, bs, lo,
                            scale, G, hd, cap, nblk, pos, ring);
  else
    rp = attn_partial_group(v, q, (const float*)buf(c, kb), (const float*)buf(c, vb), part, h, b, bs, lo, scale, G, hd,
                            cap, nblk, pos, ring);
  c.stage = rp.x;
  c.phase = (uint32_t)rp.y;
  return true;
}
