// SAMPLE: the next token drawn by temperature / top-k / top-p with one Philox4x64-10 draw keyed by the
// seed at the step's position (instructions/sampling.py is the specification). Greedy at temperature 0;
// top_k > 0: candidates from the top_k tiles by their maxima, ranked by warp 0; top_k 0: every logit in
// id order, the running sums in f64 over per-thread chunks.
#pragma once
#include "route.cuh"

// The first 64-bit word of Philox4x64-10 at counter (ctr, 0, 0, 0) under key (k0, k1).
__device__ __forceinline__ uint64_t philox4x64_first(uint64_t ctr, uint64_t k0, uint64_t k1) {
  const uint64_t M0 = 0xD2E7470EE14C6C93ull, M1 = 0xCA5A826395121157ull;
  uint64_t c0 = ctr, c1 = 0, c2 = 0, c3 = 0;
  for (int r = 0; r < 10; ++r) {
    const uint64_t lo0 = M0 * c0, hi0 = __umul64hi(M0, c0), lo1 = M1 * c2, hi1 = __umul64hi(M1, c2);
    const uint64_t n0 = hi1 ^ c1 ^ k0, n2 = hi0 ^ c3 ^ k1;
    c0 = n0; c1 = lo1; c2 = n2; c3 = lo0;
    k0 += 0x9E3779B97F4A7C15ull;
    k1 += 0xBB67AE8584CAA73Bull;
  }
  return c0;
}

__device__ __forceinline__ void sample_emit(mvm_ctx& c, int tok) {
  *(int*)buf(c, SAMPLE::token(c.ins)) = tok;
  if (c.a.seq && c.step + 1 >= c.a.n_prompt) c.a.seq[c.step + 1] = tok;
}

// top_k 0, top_p 1: the first id whose running sum of exp((x - max) / T) exceeds u * (the total).
__device__ int sample_every_token(mvm_ctx& c, const float* logits, int V, float mx, float T, float u) {
  double* part = reinterpret_cast<double*>(c.s.xs);          // [NCT] chunk sums, then [NCT] exclusive prefixes
  int* pick = reinterpret_cast<int*>(c.s.xs + 4 * NCT);      // the chunk holding the draw
  const int C = (V + NCT - 1) / NCT, i0 = c.tid * C, i1 = min(V, i0 + C);
  double s = 0.0;
  for (int i = i0; i < i1; ++i) s += exp(((double)__ldcg(logits + i) - mx) / T);
  part[c.tid] = s;
  consumer_sync();
  if (c.tid == 0) {
    double acc = 0.0;
    for (int t = 0; t < NCT; ++t) { part[NCT + t] = acc; acc += part[t]; }
    const double target = (double)u * acc;
    int t = 0;
    while (t < NCT - 1 && !(part[NCT + t] + part[t] > target && part[t] > 0.0)) ++t;
    pick[0] = t;
    reinterpret_cast<double*>(c.s.xs + 6 * NCT)[0] = target;
  }
  consumer_sync();
  int tok = -1;
  if (c.tid == pick[0]) {
    const double target = reinterpret_cast<double*>(c.s.xs + 6 * NCT)[0];
    double acc = part[NCT + c.tid];
    tok = i1 > i0 ? i1 - 1 : V - 1;
    for (int i = i0; i < i1; ++i) {
      acc += exp(((double)__ldcg(logits + i) - mx) / T);
      if (acc > target) { tok = i; break; }
    }
    sample_emit(c, tok);
  }
  return tok;
}

__device__ bool op_sample(mvm_ctx& c) {
  using Op = SAMPLE;
  const float* settings = (const float*)buf(c, Op::sampling(c.ins));
  const float T = settings[0], top_p = settings[2];
  const int k = (int)settings[1];
  const float* best = (const float*)buf(c, Op::best(c.ins));
  const float* logits = (const float*)buf(c, Op::logits(c.ins));
  const int ntiles = (int)bufinfo(c, Op::best(c.ins)).shape[0], V = (int)bufinfo(c, Op::logits(c.ins)).shape[0];
  const int R = Op::tile_rows(c.ins);
  float* tmax = c.s.xs + 8 * NCT;                                // [ntiles] tile maxima (after the f64 sums)
  for (int t = c.tid; t < ntiles; t += NCT) tmax[t] = __ldcg(best + 2 * t);
  consumer_sync();
  if (T == 0.f || k == 1) {                                      // greedy: the best tile's (max, index)
    if (c.warp == 0) {
      uint32_t taken = 0;
      const int t = take_first(tmax, ntiles, taken, c.lane);
      if (c.lane == 0) sample_emit(c, (int)__ldcg(best + 2 * t + 1));
    }
    return true;
  }
  const uint32_t seed = (uint32_t)*(const int*)buf(c, Op::seed(c.ins));
  const uint64_t w = philox4x64_first((uint64_t)input_pos(c), seed, 0);
  const float u = (float)(w >> 40) * 0x1p-24f;
  if (k == 0) {
    float m = -INFINITY;
    for (int t = 0; t < ntiles; ++t) m = fmaxf(m, tmax[t]);
    sample_every_token(c, logits, V, m, T, u);
    return true;
  }
  // the k best tiles by their maxima: every element of the top k is at least the k-th of them, so
  // the top k are the first k in rank order among those tiles' elements at or above it
  float* theta = c.s.acc;
  if (c.warp == 0) {
    uint32_t taken = 0;
    int t = 0;
    for (int j = 0; j < k && j < ntiles; ++j) t = take_first(tmax, ntiles, taken, c.lane);
    if (c.lane == 0) theta[0] = tmax[t];
  }
  consumer_sync();
  const float th = theta[0];
  float* pv = c.s.acc + 2;                                       // [k] values and ids in rank order
  int* pi = reinterpret_cast<int*>(c.s.acc + 2 + MEGAVM_MAX_TOPK);
  float* wv = c.s.red;                                           // per-warp winners
  int* wi = reinterpret_cast<int*>(c.s.red + NCW);
  float prev_v = -INFINITY;                   // nothing picked yet
  int prev_i = -1, kk = 0;
  for (; kk < k; ++kk) {                                         // pass kk: the first after the last pick
    float v = __int_as_float(0x7fffffff);
    int i = 0x7fffffff;
    for (int t = 0; t < ntiles; ++t) {
      if (!(tmax[t] >= th)) continue;
      const int r1 = min(V, (t + 1) * R);
      for (int q = t * R + c.tid; q < r1; q += NCT) {
        const float x = __ldcg(logits + q);
        if (x >= th && (prev_i < 0 || rank_before(prev_v, prev_i, x, q)) && rank_before(x, q, v, i)) { v = x; i = q; }
      }
    }
    warp_rank_first(v, i);
    if (c.lane == 0) { wv[c.warp] = v; wi[c.warp] = i; }
    consumer_sync();
    v = wv[0];
    i = wi[0];
    for (int w = 1; w < NCW; ++w)
      if (rank_before(wv[w], wi[w], v, i)) { v = wv[w]; i = wi[w]; }
    consumer_sync();                                             // wv / wi are rewritten by the next pass
    if (i == 0x7fffffff) break;                                  // fewer candidates than k
    if (c.tid == 0) { pv[kk] = v; pi[kk] = i; }
    prev_v = v;
    prev_i = i;
  }
  consumer_sync();
  if (c.tid == 0) {                                              // softmax, the top-p prefix, the draw (f64)
    double e[MEGAVM_MAX_TOPK], total = 0.0;
    const double z0 = (double)pv[0] / T;
    for (int j = 0; j < kk; ++j) { e[j] = exp((double)pv[j] / T - z0); total += e[j]; }
    int keep = kk;
    if (top_p < 1.f) {
      double before = 0.0;
      keep = 0;
      while (keep < kk && before < (double)top_p) { before += e[keep] / total; ++keep; }
      keep = max(keep, 1);
    }
    double kept = 0.0;
    for (int j = 0; j < keep; ++j) kept += e[j] / total;
    const double target = (double)u * kept;
    double acc = 0.0;
    int j = 0;
    for (; j < keep - 1; ++j) {
      acc += e[j] / total;
      if (acc > target) break;
    }
    sample_emit(c, pi[j]);
  }
  return true;
}
