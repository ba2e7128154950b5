// SAMPLE: the next token drawn by temperature / top-k / top-p with one Philox4x64-10 draw keyed by the
// seed at the step's position (instructions/sampling.py is the specification). Greedy at temperature 0;
// top_k > 0: the candidates (the logits at or above the k-th best tile maximum, in the tiles that reach
// it) gathered into shared memory in one pass of independent loads and ranked there; top_k 0: every
// logit in id order, the running sums in f64 over per-thread chunks.
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

// xs while SAMPLE ranks (sample.py: shared): the tile maxima, then the maxima's keys (sample_theta), over
// which the candidates' count, values and ids and the tiles that reach theta go next. The every-token
// draw reuses xs from 0 once it has the maxima's maximum. (Ranked by k passes over the tiles alone, each a
// round trip to L2 a tile, llama-1b's step took 1.5 ms more at top-k 32; docs/moe.md, "Sampling".)
constexpr int SAMPLE_CANDIDATES = MEGAVM_SAMPLE_CANDIDATES;
__device__ __forceinline__ int sample_tiles_end(int ntiles) { return (ntiles + 3) / 4 * 4; }

// What the out-of-line helpers below read of the context, by value. Passing them mvm_ctx& put the whole
// context in local memory for the entire kernel (its address escaped to a call): every opcode then read
// and wrote its ring position there, about 1 us a GEMV task (llama-1b 0.874 ms against 0.795 on an H200;
// docs/performance.md, session 56).
struct sample_view {
  float* xs;
  float* red;
  int tid, warp, lane;
};
__device__ __forceinline__ sample_view sample_view_of(const mvm_ctx& c) { return {c.s.xs, c.s.red, c.tid, c.warp, c.lane}; }

// theta: the tile maximum of rank `want` from the top (rank_key's order, which take_first's follows), by
// a radix select over the maxima's keys: four passes of a 256-bin histogram of one byte among the keys
// that match the bytes chosen so far, warp 0 choosing the next byte. (k rounds of take_first by one warp
// took llama-1b 47 us at top-k 32 over its 501 tiles; each maximum's rank counted over all the others,
// 13 us.) The bins lie where the candidates go next.
__device__ __noinline__ void sample_theta(sample_view c, const float* tmax, int ntiles, int want, float* theta) {
  int* hist = reinterpret_cast<int*>(c.xs + sample_tiles_end(ntiles) + 4);
  int* chosen = hist + 256;                                     // the byte, and the rank left within it
  uint32_t prefix = 0, mask = 0;
  int left = want;
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int b = c.tid; b < 256; b += NCT) hist[b] = 0;
    consumer_sync();
    for (int t = c.tid; t < ntiles; t += NCT) {
      const uint32_t key = rank_key(tmax[t]);
      if ((key & mask) == prefix) atomicAdd(hist + ((key >> shift) & 255u), 1);
    }
    consumer_sync();
    if (c.warp == 0) {                                          // lane l: bins 255 - 8 l down to 248 - 8 l
      int cnt[8], sum = 0;
#pragma unroll
      for (int i = 0; i < 8; ++i) { cnt[i] = hist[255 - 8 * c.lane - i]; sum += cnt[i]; }
      int upto = sum;                                           // keys in this lane's bins and those above
      for (int o = 1; o < 32; o <<= 1) {
        const int v = __shfl_up_sync(0xffffffffu, upto, o);
        if (c.lane >= o) upto += v;
      }
      int above = upto - sum, d = -1;
      if (above <= left && left < upto) {
#pragma unroll
        for (int i = 0; i < 8; ++i)
          if (d < 0) {
            if (left < above + cnt[i]) d = 255 - 8 * c.lane - i;
            else above += cnt[i];
          }
        chosen[0] = d;
        chosen[1] = left - above;
      }
    }
    // every thread reads chosen before the next pass's first barrier; warp 0 rewrites it after the second
    consumer_sync();
    prefix |= (uint32_t)chosen[0] << shift;
    mask |= 255u << shift;
    left = chosen[1];
  }
  for (int t = c.tid; t < ntiles; t += NCT)                     // ties: the same value (or both zeros, or NaN)
    if (rank_key(tmax[t]) == prefix) theta[0] = tmax[t];
  consumer_sync();
}

// The k best of the candidates in rank order into pv / pi (their count returned): each logit at or above
// th in a tile whose maximum is, gathered with its id in one pass (a thread takes its row of every such
// tile, up to 32 loads independent of each other: one round trip, 3.4 us on llama-1b, against 6.6 for 16
// consecutive elements of the tiles twice), then ranked by counting in shared memory. -1 where there are
// more than SAMPLE_CANDIDATES of them.
__device__ __noinline__ int sample_gather_rank(sample_view c, const float* logits, int V, int R, const float* tmax,
                                               int ntiles, float th, int k, float* pv, int* pi) {
  int* count = reinterpret_cast<int*>(c.xs + sample_tiles_end(ntiles));
  float* cv = c.xs + sample_tiles_end(ntiles) + 4;
  int* ci = reinterpret_cast<int*>(cv + SAMPLE_CANDIDATES);
  int* qt = ci + SAMPLE_CANDIDATES;                             // the tiles that reach th, in id order
  if (c.warp == 0) {
    int m = 0;
    for (int t0 = 0; t0 < ntiles; t0 += 32) {
      const int t = t0 + c.lane;
      const bool in = t < ntiles && tmax[t] >= th;
      const uint32_t bits = __ballot_sync(0xffffffffu, in);
      if (in) qt[m + __popc(bits & ((1u << c.lane) - 1u))] = t;
      m += __popc(bits);
    }
    if (c.lane == 0) count[0] = 0, count[1] = m;
  }
  consumer_sync();
  const int m = count[1];
  constexpr int B = 32;                                         // loads a thread has in flight: k tiles' rows
  for (int r = c.tid; r < R; r += NCT)                          // this thread's row of each such tile
    for (int t0 = 0; t0 < m; t0 += B) {
      float x[B];
      int q[B];
#pragma unroll
      for (int j = 0; j < B; ++j) {
        q[j] = t0 + j < m ? qt[t0 + j] * R + r : V;
        x[j] = q[j] < V ? __ldcg(logits + q[j]) : 0.f;
      }
#pragma unroll
      for (int j = 0; j < B; ++j)
        if (q[j] < V && x[j] >= th) {
          const int s = atomicAdd(count, 1);
          if (s < SAMPLE_CANDIDATES) { cv[s] = x[j]; ci[s] = q[j]; }
        }
    }
  consumer_sync();
  const int n = count[0];
  if (n > SAMPLE_CANDIDATES) return -1;
  for (int i = c.tid; i < n; i += NCT) {                        // rank = the candidates before it
    const float v = cv[i];
    const int id = ci[i];
    int rank = 0;
    for (int j = 0; j < n; ++j) rank += rank_before(cv[j], ci[j], v, id);
    if (rank < k) { pv[rank] = v; pi[rank] = id; }
  }
  return n < k ? n : k;
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

// The k best in rank order by k block-wide passes over the tiles that reach th, each taking the first
// logit after the last pick (where more than SAMPLE_CANDIDATES logits reach th); returns their count.
__device__ __noinline__ int sample_passes(sample_view c, const float* logits, int V, int R, const float* tmax, int ntiles,
                                          float th, int k, float* pv, int* pi) {
  float* wv = c.red;                                             // per-warp winners
  int* wi = reinterpret_cast<int*>(c.red + NCW);
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
  return kk;
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
  float* tmax = c.s.xs;                                          // [ntiles] tile maxima
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
  const sample_view v = sample_view_of(c);
  sample_theta(v, tmax, ntiles, min(k, ntiles) - 1, theta);
  const float th = theta[0];
  float* pv = c.s.acc + 2;                                       // [k] values and ids in rank order
  int* pi = reinterpret_cast<int*>(c.s.acc + 2 + MEGAVM_MAX_TOPK);
  int kk = sample_gather_rank(v, logits, V, R, tmax, ntiles, th, k, pv, pi);
  if (kk < 0) kk = sample_passes(v, logits, V, R, tmax, ntiles, th, k, pv, pi);
  consumer_sync();
  if (c.warp == 0) {                // softmax, the top-p prefix, the draw (f64): lane j's exp and share
    auto at = [&](double v, int j) { return __shfl_sync(0xffffffffu, v, j); };   // lane j's v, every lane
    const double z0 = (double)pv[0] / T;
    const double e = c.lane < kk ? exp((double)pv[c.lane] / T - z0) : 0.0;
    double total = 0.0;
    for (int j = 0; j < kk; ++j) total += at(e, j);             // in rank order
    const double p = e / total;
    int keep = kk;
    if (top_p < 1.f) {
      double before = 0.0;
      keep = 0;
      while (keep < kk && before < (double)top_p) { before += at(p, keep); ++keep; }
      keep = max(keep, 1);
    }
    double kept = 0.0;
    for (int j = 0; j < keep; ++j) kept += at(p, j);
    const double target = (double)u * kept;
    double acc = 0.0;
    int j = 0;
    for (; j < keep - 1; ++j) {
      acc += at(p, j);
      if (acc > target) break;
    }
    if (c.lane == 0) sample_emit(c, pi[j]);
  }
  return true;
}
