// EXPERT_GLU: h[slot, rows] = act(Wg[e][rows] @ n) * (Wu[e][rows] @ n), e = ids[slot], n = rmsnorm(x,
// gamma); with limit > 0 the gate is clamped above and the up projection both ways first.
#pragma once
#include "activations.cuh"
#include "experts.cuh"
#include "tiles.cuh"

__device__ bool op_expert_glu(mvm_ctx& c) {
  using Op = EXPERT_GLU;
  const int row0 = Op::row0(c.ins), nrows = Op::nrows(c.ins), slot = Op::slot(c.ins), act = Op::act(c.ins);
  const int wg = Op::wg(c.ins), wu = Op::wu(c.ins);
  const int F = (int)bufinfo(c, wg).shape[1], K = (int)bufinfo(c, wg).shape[2];
  const act_out ho = out_of(c, Op::h(c.ins));   // read from the tables now, not after the GEMVs
  const int e = expert_id(c, Op::ids(c.ins), slot, wg);
  if (e < 0) return false;
  load_x_norm(c, Op::x(c.ins), Op::norm(c.ins) != 0, K, Op::eps(c.ins), wg);
  gemv(c, 0, wg, nrows, K, c.s.acc, e);
  gemv(c, 1, wu, nrows, K, c.s.acc + ACC_ROWS, e);
  const float lim = Op::limit(c.ins);
  if (ho.tagged) tag_release();
  const long at = (long)slot * F + row0;
  for (int r = c.tid; r < nrows; r += NCT)
    act_store(ho.p, ho.tagged, at + r, glu(act, c.s.acc[r], c.s.acc[ACC_ROWS + r], lim), step_tag(c));
  return true;
}
