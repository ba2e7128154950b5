// ATTN_PARTIAL: one (KV head, KV block) of decode attention -> (m, l, acc) per query head of the group.
#pragma once
#include <type_traits>
#include "attn_mma_e2m1.cuh"

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

// A float as an int that orders like it (shared-memory atomicMax), and back.
__device__ __forceinline__ int ordered(float f) {
  const int b = __float_as_int(f);
  return b ^ ((b >> 31) & 0x7fffffff);
}
__device__ __forceinline__ float unordered(int b) { return __int_as_float(b ^ ((b >> 31) & 0x7fffffff)); }

// Scores of keys [kr.j0, j1) against the pre-scaled q of every query head: sc[g n + j], and their
// running maxima mx[g] (ordered ints). GQ query heads at a time keep their q pieces in registers; a
// key's P lanes each meet their piece with every head's, then halve the heads between lane pairs at
// each butterfly step (the sums meet in log2(P) shuffle rounds of GQ/2, GQ/4, ... values), so each
// lane ends holding whole sums of GQ/P heads (or one head, shared with its P/GQ neighbours).
template <typename T, int GQ>
__device__ __forceinline__ void attn_scores(const attn_view& c, const float* qs, float* sc, int* mx,
                                            const kv_rows<T>& kr, int j1, int n, int G, int hd) {
  const attn_lanes L(c.lane, hd);
  int base = 0, held = GQ, shared_by = 1;        // the heads this lane ends holding: base .. base + held
  for (int o = L.P / 2; o > 0; o >>= 1) {
    if (held > 1) { held /= 2; base += (L.p & o) ? held : 0; }
    else shared_by *= 2;
  }
  const bool writer = (L.p & (shared_by - 1)) == 0;
  for (int g0 = 0; g0 < G; g0 += GQ) {
    float qr[GQ][8];
#pragma unroll
    for (int k = 0; k < GQ; ++k) {
      const float* qg = qs + min(g0 + k, G - 1) * hd + L.p * 8;
      const float4 qa = L.on ? *reinterpret_cast<const float4*>(qg) : make_float4(0.f, 0.f, 0.f, 0.f);
      const float4 qb = L.on ? *reinterpret_cast<const float4*>(qg + 4) : make_float4(0.f, 0.f, 0.f, 0.f);
      qr[k][0] = qa.x; qr[k][1] = qa.y; qr[k][2] = qa.z; qr[k][3] = qa.w;
      qr[k][4] = qb.x; qr[k][5] = qb.y; qr[k][6] = qb.z; qr[k][7] = qb.w;
    }
    float top[GQ];
#pragma unroll
    for (int k = 0; k < GQ; ++k) top[k] = -INFINITY;
#pragma unroll 2
    for (int jw = kr.j0 + c.warp * L.kpw; jw < j1; jw += NCW * L.kpw) {   // the whole warp iterates: it shuffles
      const int j = jw + L.t;
      float kv[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
      if (j < j1 && L.on) kr.load(j, hd, L.p, kv);
      float s[GQ];
#pragma unroll
      for (int k = 0; k < GQ; ++k) {
        float a = qr[k][0] * kv[0], b = qr[k][4] * kv[4];
#pragma unroll
        for (int e = 1; e < 4; ++e) { a = fmaf(qr[k][e], kv[e], a); b = fmaf(qr[k][4 + e], kv[4 + e], b); }
        s[k] = a + b;
      }
#pragma unroll
      for (int r = 0; r < 5; ++r) {              // halve the heads held at each round while there are two
        const int o = L.P >> (r + 1);
        if (o == 0) break;
        const bool up = L.p & o;
        if ((GQ >> (r + 1)) > 0) {
#pragma unroll
          for (int k = 0; k < (GQ >> (r + 1)); ++k) {
            const float send = up ? s[k] : s[k + (GQ >> (r + 1))];
            const float keep = up ? s[k + (GQ >> (r + 1))] : s[k];
            s[k] = keep + __shfl_xor_sync(0xffffffffu, send, o);
          }
        } else {
          s[0] += __shfl_xor_sync(0xffffffffu, s[0], o);
        }
      }
      if (writer && j < j1)
#pragma unroll
        for (int k = 0; k < GQ; ++k)
          if (k < held && g0 + base + k < G) {
            sc[(g0 + base + k) * n + j] = s[k];
            top[k] = fmaxf(top[k], s[k]);
          }
    }
    // the maxima: over the warp's keys (lanes apart by P or more), then across warps
#pragma unroll
    for (int k = 0; k < GQ; ++k)
      for (int o = 16; o >= L.P; o >>= 1) top[k] = fmaxf(top[k], __shfl_xor_sync(0xffffffffu, top[k], o));
    if (writer && L.t == 0)
#pragma unroll
      for (int k = 0; k < GQ; ++k)
        if (k < held && g0 + base + k < G && top[k] > -INFINITY) atomicMax(mx + g0 + base + k, ordered(top[k]));
  }
}

// Key splits of the value sums: warps take groups of GB query heads, the warps beyond the head groups
// split the keys (at most MEGAVM_ATTN_KEY_SPLITS ways per group; attention.py: partial_scratch).
template <int GB> struct value_split {
  int HG, KS, hg, ks, g0;
  __device__ __forceinline__ value_split(int warp, int G) {
    HG = (G + GB - 1) / GB;
    KS = min(NCW, MEGAVM_ATTN_KEY_SPLITS) / HG;
    hg = warp % HG;
    ks = warp / HG;
    g0 = hg * GB;
  }
};

// The value sums of keys [vr.j0, j1) for heads g0 .. g0 + GB, weights p = exp(sc[g n + j] - m[k]) (m:
// the heads' maxima): a[k][e] += p V[j][8 piece + e], w[k] += p (the sum of the weights). Each lane
// keeps its own keys' sums in registers across calls.
template <typename T, int GB>
__device__ __forceinline__ void attn_values(const attn_lanes& L, const value_split<GB>& vs, const float* sc,
                                            const float (&m)[GB], float (&a)[GB][8], float (&w)[GB],
                                            const kv_rows<T>& vr, int j1, int n, int G, int hd) {
  if (vs.ks >= vs.KS) return;
  const int slots = vs.KS * L.kpw;
#pragma unroll 2
  for (int j = vr.j0 + vs.ks * L.kpw + L.t; j < j1; j += slots) {
    float v[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
    if (L.on) vr.load(j, hd, L.p, v);
#pragma unroll
    for (int k = 0; k < GB; ++k) {
      const float p = expf(sc[min(vs.g0 + k, G - 1) * n + j] - m[k]);
      w[k] += p;
#pragma unroll
      for (int e = 0; e < 8; ++e) a[k][e] = fmaf(p, v[e], a[k][e]);
    }
  }
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

// A quantized cache's scales on the tensor-core path, staged in shared memory a pass at a time (two buffers
// after the own rows; attention.py: staged_scales): a buffer holds the row scales of a ring stage's keys and
// of the own row, then an e2m1 cache's block scales as words, key by key. The consumer threads load pass i
// (K passes 0 .. P - 1, then the V passes) from L2 into registers while pass i - 1 is computed, store it
// into buffer i % 2 once every warp is done with pass i - 2's, and meet at a barrier before reading it, so
// the key tiles wait on shared memory, not on L2 (each waited on an L2 load of its scales before).
template <typename T, int HD> struct pass_scales {
  static constexpr bool E2M1 = std::is_same<T, mvm_e2m1kv>::value;
  static constexpr int BW = E2M1 ? HD / 64 : 0;                      // block-scale words a key
  static constexpr int SK = STAGE_BYTES / (E2M1 ? HD / 2 : HD) + 4;  // keys a buffer: a stage's, the own row
  static constexpr int WORDS = SK * (1 + BW);                        // words a buffer
  static constexpr int NW = (WORDS + NCT - 1) / NCT;                 // words a thread moves
  static_assert(STAGE_BYTES <= 16384, "attention.py: staged_scales sizes the buffers for stages of 16 KiB");
  // row scales as the tensor-core loops take them (powers of two, exact): e4m3 keys / E4M3_LIFT, values x
  // E4M3_LIFT (attn_mma_e4m3.cuh); e2m1 E2M1_KSCALE, E2M1_VSCALE (attn_mma_e2m1.cuh)
  static constexpr float KMUL = E2M1 ? E2M1_KSCALE : 1.f / E4M3_LIFT;
  static constexpr float VMUL = E2M1 ? E2M1_VSCALE : E4M3_LIFT;
  const float *ks, *vs;                          // scales of key 0 of the block (K, V)
  const uint8_t *kb, *vb;                        // e2m1: block scales of key 0
  int P, R, n, tid;                              // passes of K (and of V), keys a pass, keys in all
  uint32_t base;                                 // buffer 0's shared address
  uint32_t r[NW], r2[NW];                        // pass i + 1's words; r2: the V pass's of a single-pass block
  __device__ __forceinline__ uint32_t buffer(int i) const { return base + 4 * WORDS * (i & 1); }
  __device__ __forceinline__ void fetch(int i, uint32_t (&to)[NW]) const {
    const int k = i % P, j0 = k * R, j1 = k + 1 < P ? j0 + R : n;
    const float* sc = i < P ? ks : vs;
    const uint8_t* bs = i < P ? kb : vb;
#pragma unroll
    for (int e = 0; e < NW; ++e) {
      const int w = tid + e * NCT;
      uint32_t x = 0u;
      if (w < SK) {
        if (j0 + w < j1) x = __float_as_uint(__ldcg(sc + j0 + w));   // multiplied when stored: no wait here
      } else if (BW > 0 && w < WORDS) {
        const int j = j0 + (w - SK) / max(BW, 1);
        if (j < j1) x = __ldcg(reinterpret_cast<const unsigned int*>(bs + (long)j * (HD / 16)) + (w - SK) % max(BW, 1));
      }
      to[e] = x;
    }
  }
  __device__ __forceinline__ void put(int i, const uint32_t (&from)[NW]) const {
    const float mul = i < P ? KMUL : VMUL;
#pragma unroll
    for (int e = 0; e < NW; ++e) {
      const int w = tid + e * NCT;
      if (w < WORDS) sts32(buffer(i) + 4 * w, w < SK ? __float_as_uint(__uint_as_float(from[e]) * mul) : from[e]);
    }
  }
  // Before the partial's q: the first pass's scales on their way (and a single-pass block's V pass's).
  __device__ __forceinline__ void begin() {
    fetch(0, r);
    if (P == 1) fetch(1, r2);
  }
  // Before the barrier that opens the K passes: the first pass's scales stored (a single-pass block's V
  // pass's too: it then needs no barrier of its own), the second's on their way.
  __device__ __forceinline__ void ready() {
    put(0, r);
    if (P == 1) put(1, r2);
    else fetch(1, r);
  }
  // After pass i: pass i + 1's scales into their buffer (pass i - 1's, which every warp is done with), pass
  // i + 2's loads issued, and the barrier that makes pass i + 1's visible and frees pass i's buffer.
  __device__ __forceinline__ void advance(int i) {
    if (P == 1 || i + 1 >= 2 * P) return;
    put(i + 1, r);
    if (i + 2 < 2 * P) fetch(i + 2, r);
    consumer_sync();
  }
};

// Scratch (attention.py: partial_scratch): qs [G][hd] pre-scaled | sc [G][bs] scores, then the key
// splits' sums [KS][G][hd + 2] | mx [G] | the step's own K and V rows (16-byte aligned). HD > 0: the
// tensor-core path (attn_mma.cuh; bf16 rows in ring stages, head_dim HD, G <= 8), the warps' key tiles
// as the splits.
template <typename T, int GB, int HD = 0>
__device__ __forceinline__ int2 attn_partial_impl(attn_view c, const float* q, const T* kc, const T* vc, float* part, int h,
                                  int b, int bs, int lo, float scale, int G, int hd, long cap, int nblk, int pos,
                                  bool ring, const float* ksc, const float* vsc) {
  const int W = hd + 2, GH = G * hd;
  float* out = part + ((long)h * nblk + b) * G * W * (c.tag ? 2 : 1);   // tagged: 8-byte words
  const int hi = min((b + 1) * bs, pos + 1);
  if (hi <= lo) {
    for (int i = c.tid; i < G * W; i += NCT) act_store(out, c.tag != 0, i, (i % W == 0) ? -INFINITY : 0.f, c.tag);
    return make_int2(c.stage, (int)c.phase);
  }
  const int n = hi - lo, nh = max(0, min((b + 1) * bs, pos) - lo);    // keys; keys before pos
  const value_split<GB> vs(c.warp, G);
  const int KW = min(NCW, MEGAVM_ATTN_KEY_SPLITS);                     // the tensor-core path's splits
  const int KS = HD > 0 ? KW : vs.KS;
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
  for (int i = c.tid; i < GH; i += NCT)
    qs[i] = (c.qt ? poll_value(*c.a, blockIdx.x, c.qpos, c.ins, c.qb, q, (long)h * GH + i, c.step_tag)
                  : __ldcg(q + (long)h * GH + i)) * scale;
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
    float acc[HD / 8][4], w = 0.f;
#pragma unroll
    for (int nt = 0; nt < HD / 8; ++nt) acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.f;
    for (int k = 0; k < passes; ++k) {
      const kv_rows<T> rows{k < chunks ? vp.chunk(c, k) : nullptr, ring, k * R, (const T*)own + ru, nh, lo, sw, v_sc, v_bs,
                            ps.buffer(passes + k), ps.SK};
      if (MVM_PROBE_ATTN_CUT == 0 && c.warp < KW)
        attn_values_mma<HD>(c, sc, m, acc, w, rows, k + 1 < passes ? (k + 1) * R : n, n, G, KW);
      if (k < chunks) vp.done(c);
      if constexpr (STAGED) ps.advance(passes + k);
    }
    // each warp's sums into [warp][G][W] over the scores (all read by now)
    w += __shfl_xor_sync(0xffffffffu, w, 1);
    w += __shfl_xor_sync(0xffffffffu, w, 2);
    consumer_sync();
    if (c.warp < KW && g < G) {
      float* red = sc + ((long)c.warp * G + g) * W;
      if (t == 0) red[1] = w;
#pragma unroll
      for (int nt = 0; nt < HD / 8; ++nt) {       // e4m3: n-tile nt holds elements 16 (nt / 2) + 4t + nt % 2, + 2;
        if constexpr (std::is_same<T, mvm_e2m1kv>::value) {   // e2m1: 32 (nt / 4) + 8t + nt % 4, + 4
          const int e0 = 32 * (nt / 4) + 8 * t + nt % 4;
          red[2 + e0] = acc[nt][0] * (1.f / E2M1_VLIFT);
          red[2 + e0 + 4] = acc[nt][1] * (1.f / E2M1_VLIFT);
        } else {
          const int e0 = sizeof(T) == 1 ? 16 * (nt / 2) + 4 * t + nt % 2 : nt * 8 + 2 * t;
          const float lift = sizeof(T) == 1 ? 1.f / E4M3_LIFT : 1.f;
          red[2 + e0] = acc[nt][0] * lift;
          red[2 + e0 + (sizeof(T) == 1 ? 2 : 1)] = acc[nt][1] * lift;
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
// most 8 (attention.py: mma_shape, which sizes the scratch for its splits); the CUDA-core path everything
// else.
__device__ __forceinline__ bool attn_mma(bool ring, int G, int hd) {
  return MVM_ATTN_MMA && ring && G <= 8 && (hd == 64 || hd == 128);
}

// The instance for the shape: on tensor cores (MMA, where attn_mma takes it) head_dim 64 or 128; on CUDA
// cores with the score lanes holding GB = 1, 2 or 4 heads' q at a time (attention.py: head_batch).
template <typename T, bool MMA>
__device__ __forceinline__ int2 attn_partial_shape(attn_view v, const float* q, const T* kc, const T* vc, float* part,
                                                   int h, int b, int bs, int lo, float scale, int G, int hd, long cap,
                                                   int nblk, int pos, bool ring, const float* ks, const float* vs) {
  if constexpr (MMA) {
    if (hd == 64) return attn_partial_impl<T, 4, 64>(v, q, kc, vc, part, h, b, bs, lo, scale, G, hd, cap, nblk, pos, ring, ks, vs);
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
  const int G = (int)pinfo.shape[2], hd = (int)kinfo.shape[2], nblk = (int)pinfo.shape[1];
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
  if constexpr (sizeof(T) == 2)                  // bf16 rows
    if (attn_mma(ring, G, hd)) return attn_partial_shape<T, true>(v, q, kc, vc, part, h, b, bs, lo, scale, G, hd, cap, nblk, pos, ring, ks, vs);
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
  const int G = (int)pinfo.shape[2], hd = (int)kinfo.shape[2], nblk = (int)pinfo.shape[1];
  const int h = Op::kv_head(c.ins), b = Op::block(c.ins), bs = Op::block_size(c.ins), lo = attn_first_key(c, pos);
  // the history streams came through the ring (loader.cuh walks them the same way)
  const bool ring = !c.direct && !(c.a.flags & MVM_FLAG_NO_ATTN_HISTORY) && c.ins->n_streams == 2;
  const int qb = Op::q(c.ins), krb = Op::k_row(c.ins), vrb = Op::v_row(c.ins);
  const attn_view v{&c.s, c.tid, c.warp, c.lane, c.stage, c.phase, buf_tagged(c, pb) ? step_tag(c) : 0u, &c.a, c.ins,
                    c.qpos, step_tag(c), qb, krb, vrb, buf_tagged(c, qb), krb >= 0 ? (const float*)buf(c, krb) : nullptr,
                    vrb >= 0 ? (const float*)buf(c, vrb) : nullptr};
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
