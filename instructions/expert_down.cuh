// EXPERT_DOWN: y[rows] = res[rows] + Ws[rows] @ hs + sum_j weights[j] * (Wd[ids[j]][rows] @ h[j]), in
// that order (the loader streams the shared rows, then the k chosen experts' rows, one run each). h is
// tagged where the program tags it (the GLU tiles' wait polled): its words are polled here.
#pragma once
#include "experts.cuh"
#include "gemv.cuh"

__device__ bool op_expert_down(mvm_ctx& c) {
  using Op = EXPERT_DOWN;
  const int row0 = Op::row0(c.ins), nrows = Op::nrows(c.ins);
  const int wd = Op::wd(c.ins), ids = Op::ids(c.ins);
  const int F = (int)bufinfo(c, wd).shape[2], k = (int)bufinfo(c, ids).shape[0];
  // the ids and weights in one round trip to L2, into shared memory below the register path's sums
  int* eid = reinterpret_cast<int*>(c.s.xs + (MEGAVM_MAX_K - PART_FLOATS - 2 * MEGAVM_MAX_TOPK));
  float* ew = c.s.xs + (MEGAVM_MAX_K - PART_FLOATS - MEGAVM_MAX_TOPK);
  const float* weights = (const float*)buf(c, Op::weights(c.ins));
  if (c.tid < k) {
    eid[c.tid] = __ldcg((const int*)buf(c, ids) + c.tid);
    ew[c.tid] = __ldcg(weights + c.tid);
  }
  consumer_sync();
  const long E = bufinfo(c, wd).shape[0];
  int e_of[MEGAVM_MAX_TOPK];                     // this thread's copy: the vectors loaded below may cover eid / ew
  float w_of[MEGAVM_MAX_TOPK];
  for (int j = 0; j < k; ++j) {
    if (!input_in_range(c, eid[j], E)) return false;
    e_of[j] = eid[j];
    w_of[j] = ew[j];
  }
  consumer_sync();
  const int rb = Op::res(c.ins);
  const float* res = (const float*)buf(c, rb);
  const bool rt = buf_tagged(c, rb);
  float* sum = c.s.acc + ACC_ROWS;               // the tile's rows of y so far
  for (int r = c.tid; r < nrows; r += NCT) sum[r] = act_at(c, rb, res, rt, row0 + r);
  const int hs = Op::h_shared(c.ins), ws = Op::w_shared(c.ins);
  int si = 0;                                    // the instruction's stream the next GEMV consumes
  if (hs >= 0) {
    const int Fs = (int)bufinfo(c, hs).shape[0];
    load_x(c, (const float*)buf(c, hs), false, Fs, 0.f, xs_split(c, ws));
    gemv(c, si++, ws, nrows, Fs, c.s.acc);
    for (int r = c.tid; r < nrows; r += NCT) sum[r] += c.s.acc[r];
  }
  // h read from the tables here, not held across the shared expert's GEMV (two more registers there
  // made the main loop spill)
  const int hb = Op::h(c.ins);
  const float* h = (const float*)buf(c, hb);
  const bool ht = buf_tagged(c, hb);             // h's words polled: no wait on the GLU tiles' counter
  const int split = xs_split(c, wd);
  // every vector at once where k F fits the whole xs below the most sums: by the capacity, not the build's
  // xs, so every build takes the same path (a build sized to the program holds k F and the tile's sums)
  const bool at_once = k * F <= REG_MAX_K;
  // n elements of h from element at into xs, vector by vector (element i at xs + (i / F) F + xs_index(i % F)),
  // plain, or tagged: each group of four words settled as it lands, polled out of line until it is this step's
  auto load_h = [&](long at, int n) {
    for (int i = c.tid * 4; i < n; i += NCT * 4) {
      const int j = i / F, f = i - j * F;        // F is a multiple of 8: a float4 stays in one vector
      float4 v;
      if (ht) {
        const uint64_t* hw = reinterpret_cast<const uint64_t*>(h) + at;
        uint64_t w0, w1, w2, w3;
        ld_words2(hw + i, w0, w1);
        ld_words2(hw + i + 2, w2, w3);
        v = act4_settle(c, hb, hw, i, w0, w1, w2, w3);
      } else {
        v = __ldcg(reinterpret_cast<const float4*>(h + at + i));
      }
      *reinterpret_cast<float4*>(c.s.xs + j * F + xs_index(f, F, split)) = v;
    }
    if (ht) tag_acquire();
    consumer_sync();
  };
  if (at_once) load_h(0, k * F);                 // every h[j] in one pass: one round trip to L2, not k
  const int dt = bufinfo(c, wd).dtype;
  // two experts a trip (gemv_experts_pairs) where each warp has at most two rows and a lane at most four
  // pieces: a run is then at most 32 KB, and every sized tier's ring holds two (the stage check is a guard
  // against a hand-set ring, not a path that differs between the tiers). Direct loads keep the one-pass
  // loop below: its sums differ from the pairs' in the last bits (test_moe holds both to ReferenceVM).
  const int pieces = (F / 8 + 31) / 32;
  const int run_stages = (nrows * 2 * F + STAGE_BYTES - 1) / STAGE_BYTES;
  if (MVM_DOWN_PAIRS && at_once && dt == MVM_BF16 && gemv_kp(c, wd) == 0 && !c.direct && nrows <= 2 * NCW &&
      pieces <= 4 && 2 * run_stages <= STAGES) {
    const gemv_view v{c.s.ring[0], c.s.xs, nullptr, smem_addr(&c.s.full[0]), smem_addr(&c.s.empty[0]), c.stage,
                      c.phase, c.warp, c.lane, false};
    const int2 rp = pieces == 1 ? gemv_experts_pairs<1>(v, w_of, k, nrows, F, sum)
                    : pieces == 2 ? gemv_experts_pairs<2>(v, w_of, k, nrows, F, sum)
                    : pieces == 3 ? gemv_experts_pairs<3>(v, w_of, k, nrows, F, sum)
                                  : gemv_experts_pairs<4>(v, w_of, k, nrows, F, sum);
    c.stage = rp.x;
    c.phase = (uint32_t)rp.y;
    consumer_sync();
  } else if (at_once && (dt == MVM_BF16 || dt == MVM_F32) && gemv_kp(c, wd) == 0) {
    // one pass: each warp adds w_j times its rows' sums as it goes, with no block barrier between
    // experts (their rows stream back to back)
    const gemv_view v{c.s.ring[0], c.s.xs, nullptr, smem_addr(&c.s.full[0]), smem_addr(&c.s.empty[0]), c.stage,
                      c.phase, c.warp, c.lane, c.direct};
    const uint64_t matrix = (uint64_t)bufinfo(c, wd).shape[1] * F * elem_bytes(dt);
    const int2 rp = gemv_experts_add(v, stream_base(c, si, wd, 0), matrix, e_of, w_of, k, nrows, F, sum, dt == MVM_BF16);
    c.stage = rp.x;
    c.phase = (uint32_t)rp.y;
    consumer_sync();
  } else {
    for (int j = 0; j < k; ++j) {
      int at = j * F;
      if (!at_once) {
        load_h((long)j * F, F);
        at = 0;
      }
      gemv(c, si, wd, nrows, F, c.s.acc, e_of[j], at);
      for (int r = c.tid; r < nrows; r += NCT) sum[r] = __fmaf_rn(w_of[j], c.s.acc[r], sum[r]);
      consumer_sync();                           // acc is the next expert's
    }
  }
  float* y = (float*)buf(c, Op::y(c.ins));
  const bool yt = buf_tagged(c, Op::y(c.ins));
  if (yt) tag_release();
  for (int r = c.tid; r < nrows; r += NCT) act_store(y, yt, row0 + r, sum[r], step_tag(c));
  return true;
}
