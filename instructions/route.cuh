// ROUTE: scores, optional bias and groups, the stable top-k and the chosen experts' weights (or the
// ids of a hash table), by warp 0: a lane holds experts lane, lane + 32, ... (at most 32 of them).
#pragma once
#include "device.cuh"
#include "tagged.cuh"

// Rank order of the routers: larger first, a NaN after every number, ties to the lower index.
__device__ __forceinline__ bool rank_before(float va, int ia, float vb, int ib) {
  const bool na = va != va, nb = vb != vb;
  if (na != nb) return nb;
  if (!na && va != vb) return va > vb;
  return ia < ib;
}

// The warp's first in rank order of (v, i); every lane gets it.
__device__ __forceinline__ void warp_rank_first(float& v, int& i) {
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, v, o);
    const int oi = __shfl_xor_sync(0xffffffffu, i, o);
    if (rank_before(ov, oi, v, i)) { v = ov; i = oi; }
  }
}

// An order-preserving unsigned key of rank_before's value order: larger first, every number above a
// NaN (key 0), -0 and +0 equal (both +0). Equal keys rank by the lower index.
__device__ __forceinline__ uint32_t rank_key(float v) {
  if (v != v) return 0u;
  const uint32_t u = __float_as_uint(v + 0.0f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// The next of n keys (key[e] for e = lane + 32 m) in rank order among those not taken (bit m of
// this lane's mask); marks it taken and returns its index, the same in every lane. The warp's
// winner is two single-instruction reductions: the largest key, then the lowest index holding it.
__device__ __forceinline__ int take_first(const float* key, int n, uint32_t& taken, int lane) {
  uint32_t best = 0u;
  int i = 0x7fffffff;
  for (int m = 0; lane + 32 * m < n; ++m) {
    const int e = lane + 32 * m;
    if (taken >> m & 1u) continue;
    const uint32_t kk = rank_key(key[e]);
    if (i == 0x7fffffff || kk > best) { best = kk; i = e; }
  }
  const uint32_t top = __reduce_max_sync(0xffffffffu, best);
  i = __reduce_min_sync(0xffffffffu, best == top ? i : 0x7fffffff);
  if ((i & 31) == lane) taken |= 1u << (i >> 5);
  return i;
}

__device__ __forceinline__ float route_score(int fn, float x, float m, float inv_sum) {
  switch (fn) {
    case 0: return expf(x - m) * inv_sum;                                   // softmax
    case 1: return 1.f / (1.f + expf(-x));                                  // sigmoid
    default: return sqrtf(fmaxf(x, 0.f) + log1pf(expf(-fabsf(x))));         // sqrt(softplus)
  }
}

// ROUTE for E <= MEGAVM_ROUTE_WARP_EXPERTS (128) experts without groups or a hash table, in warp 0's
// registers (expert e = lane + 32 q in x[q]; entries past E hold anything; bias(e): the ranking bias, 0
// without one): the scores, ranking keys, the stable top-k and the renormalised weights with no
// shared-memory round trip, each round two single-instruction reductions and a shuffle (the general
// path in shared memory spent 0.45 us a round, docs/moe.md). The same sums in the same order as the
// general path below, which routing.py specifies. Lane j < k returns slot j's id and weight.
static_assert(MEGAVM_ROUTE_WARP_EXPERTS == 4 * 32, "route_128 holds four experts a lane");
template <typename Bias>
__device__ __forceinline__ void route_128(const float (&x)[4], int E, int k, int fn, Bias bias, bool renorm, float eps,
                                          float scale, int lane, int& id, float& weight) {
  float m = -INFINITY;
#pragma unroll
  for (int q = 0; q < 4; ++q)
    if (lane + 32 * q < E) m = fmaxf(m, x[q]);
  m = warp_max(m);
  float inv_sum = 1.f;
  if (fn == 0) {
    float s = 0.f;
#pragma unroll
    for (int q = 0; q < 4; ++q)
      if (lane + 32 * q < E) s += expf(x[q] - m);
    inv_sum = 1.f / warp_sum(s);
  }
  float sc[4];
  uint32_t key[4];                               // rank_key + 1; 0: taken, or no expert
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    const int e = lane + 32 * q;
    sc[q] = route_score(fn, x[q], m, inv_sum);
    key[q] = e < E ? rank_key(sc[q] + bias(e)) + 1u : 0u;
  }
  float total = 0.f;
  id = 0;
  weight = 0.f;
  for (int j = 0; j < k; ++j) {
    uint32_t best = key[0];
    int i = lane;
#pragma unroll
    for (int q = 1; q < 4; ++q)
      if (key[q] > best) { best = key[q]; i = lane + 32 * q; }
    const uint32_t top = __reduce_max_sync(0xffffffffu, best);
    i = __reduce_min_sync(0xffffffffu, best == top ? i : 0x7fffffff);
    const int q = i >> 5;
    float mine = sc[0];
#pragma unroll
    for (int r = 1; r < 4; ++r)
      if (q == r) mine = sc[r];
    const float s = __shfl_sync(0xffffffffu, mine, i & 31);
    if ((i & 31) == lane) {
#pragma unroll
      for (int r = 0; r < 4; ++r)
        if (q == r) key[r] = 0u;
    }
    total += s;
    if (lane == j) { id = i; weight = s; }
  }
  total += eps;
  if (renorm) weight = total > 0.f ? weight / total : 0.f;
  weight *= scale;
}

__device__ bool op_route(mvm_ctx& c) {
  using Op = ROUTE;
  const int table = Op::table(c.ins), out_ids = Op::ids(c.ins);
  const int k = (int)bufinfo(c, out_ids >= 0 ? out_ids : Op::weights(c.ins)).shape[0];
  const int tok = input_token(c);
  if (table >= 0 && !input_in_range(c, tok, bufinfo(c, table).shape[0])) return false;
  if (Op::logits(c.ins) < 0) {                   // a hash layer's ids alone, at the step's start
    const int* row = (const int*)buf(c, table) + (long)tok * k;
    for (int j = c.tid; j < k; j += NCT) ((int*)buf(c, out_ids))[j] = row[j];
    return true;
  }
  const int E = (int)bufinfo(c, Op::logits(c.ins)).shape[0];
  if (c.warp != 0) return true;
  const int lane = c.lane, fn = Op::score(c.ins);
  const int lb = Op::logits(c.ins);
  const float* logits = (const float*)buf(c, lb);
  const bool lt = buf_tagged(c, lb);             // tagged: polled here, the wait on the router tiles met by them
  const int bias = Op::bias(c.ins);
  if (E <= MEGAVM_ROUTE_WARP_EXPERTS && table < 0 && Op::n_group(c.ins) <= 1) {
    float x[4];
    const int n = min(4, (E - lane + 31) / 32);   // this lane's experts: lane + 32 q, q < n
    if (lt) {                                     // polled together: one round trip once the router tiles' words land
      const float4 v = poll4_strided(c.a, c.block, c.qpos, c.ins, lb, reinterpret_cast<const uint64_t*>(logits), lane,
                                     32, n, step_tag(c));
      x[0] = v.x;
      x[1] = v.y;
      x[2] = v.z;
      x[3] = v.w;
    } else {
#pragma unroll
      for (int q = 0; q < 4; ++q) x[q] = q < n ? __ldcg(logits + lane + 32 * q) : 0.f;
    }
    int id;
    float w;
    const bool bf = bias >= 0 && bufinfo(c, bias).dtype == MVM_BF16;
    const void* bp = bias >= 0 ? buf(c, bias) : nullptr;
    route_128(x, E, k, fn, [&](int e) {
      return bias < 0 ? 0.f : bf ? __bfloat162float(((const __nv_bfloat16*)bp)[e]) : ((const float*)bp)[e];
    }, Op::renorm(c.ins) != 0, Op::eps(c.ins), Op::scale(c.ins), lane, id, w);
    if (lane < k) {
      ((float*)buf(c, Op::weights(c.ins)))[lane] = w;
      if (out_ids >= 0) ((int*)buf(c, out_ids))[lane] = id;
    }
    return true;
  }
  float* score = c.s.xs;                         // [E] unbiased scores
  float* key = c.s.xs + MEGAVM_MAX_EXPERTS;      // [E] ranking keys
  float m = -INFINITY;
  for (int e = lane; e < E; e += 32) {
    score[e] = act_at(c, lb, logits, lt, e);
    m = fmaxf(m, score[e]);
  }
  m = warp_max(m);
  float inv_sum = 1.f;
  if (fn == 0) {
    float s = 0.f;
    for (int e = lane; e < E; e += 32) s += expf(score[e] - m);
    inv_sum = 1.f / warp_sum(s);
  }
  for (int e = lane; e < E; e += 32) {
    score[e] = route_score(fn, score[e], m, inv_sum);
    key[e] = score[e];
    if (bias >= 0)
      key[e] += bufinfo(c, bias).dtype == MVM_BF16 ? __bfloat162float(((const __nv_bfloat16*)buf(c, bias))[e])
                                                    : ((const float*)buf(c, bias))[e];
  }
  __syncwarp();
  int* chosen = (int*)(c.s.xs + 2 * MEGAVM_MAX_EXPERTS);
  if (table >= 0) {                              // hash routing: the ids are the token's row
    const int* row = (const int*)buf(c, table) + (long)tok * k;
    bool bad = false;
    for (int j = lane; j < k; j += 32) {
      const int e = row[j];
      bad |= e < 0 || e >= E;
      chosen[j] = e;
      if (e < 0 || e >= E) mvm_fail(c.a, MVM_ERR_BAD_INPUT, c.block, c.qpos, c.ins, -1, (uint32_t)e, (uint32_t)E);
    }
    if (__any_sync(0xffffffffu, bad)) return false;
  } else {
    const int groups = Op::n_group(c.ins);
    if (groups > 1) {                            // keep the topk_group groups of best top-2 sums
      const int gs = E / groups;
      float* gkey = c.s.xs + 3 * MEGAVM_MAX_EXPERTS;
      for (int g = lane; g < groups; g += 32) {
        float v1 = __int_as_float(0x7fffffff), v2 = v1;
        int i1 = 0x7fffffff, i2 = i1;
        for (int e = g * gs; e < (g + 1) * gs; ++e) {
          if (rank_before(key[e], e, v1, i1)) { v2 = v1; i2 = i1; v1 = key[e]; i1 = e; }
          else if (rank_before(key[e], e, v2, i2)) { v2 = key[e]; i2 = e; }
        }
        gkey[g] = v1 + v2;
      }
      __syncwarp();
      uint32_t gtaken = 0;
      for (int t = 0; t < Op::topk_group(c.ins); ++t) take_first(gkey, groups, gtaken, lane);
      // bit m of this lane's gtaken marks group lane + 32 m kept: every other group's experts drop out
      for (int m2 = 0; lane + 32 * m2 < groups; ++m2) {
        const int g = lane + 32 * m2;
        if (!(gtaken >> m2 & 1u))
          for (int e = g * gs; e < (g + 1) * gs; ++e) key[e] = -INFINITY;
      }
      __syncwarp();
    }
    uint32_t taken = 0;
    for (int j = 0; j < k; ++j) {
      const int e = take_first(key, E, taken, lane);
      if (lane == 0) chosen[j] = e;
    }
  }
  __syncwarp();
  // weights from the unbiased scores, renormalised in slot order, then scaled
  float total = 0.f;
  if (Op::renorm(c.ins)) {
    for (int j = 0; j < k; ++j) total += score[chosen[j]];
    total += Op::eps(c.ins);
  }
  float* w = (float*)buf(c, Op::weights(c.ins));
  for (int j = lane; j < k; j += 32) {
    float v = score[chosen[j]];
    if (Op::renorm(c.ins)) v = total > 0.f ? v / total : 0.f;
    w[j] = v * Op::scale(c.ins);
    if (out_ids >= 0) ((int*)buf(c, out_ids))[j] = chosen[j];
  }
  return true;
}
