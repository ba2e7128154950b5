// The attention partial's score and value loops on CUDA cores (attn_partial.cuh takes them for the shapes and
// runs the tensor-core loops of attn_mma*.cuh do not): lanes meet K/V rows in pieces of 8 elements.
#pragma once
#include "kv_rows.cuh"

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
