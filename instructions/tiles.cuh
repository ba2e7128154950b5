// What the normed projections (RMS_*) share: the RMSNorm prologue, with gamma prefetched into xs
// before the wait when the norm is fused (param norm), and the tile's GEMV,
// acc[0:nrows] = W[rows] @ rmsnorm(x) (returning 1 / rms(x), or 1 unnormed). Op is the opcode's accessor struct (opcodes.cuh).
#pragma once
#include "gemv.cuh"
#include "lora.cuh"

// The pre-wait hook (weights never wait): gamma into xs, in the layout w's GEMV reads, when the
// opcode normalises x itself.
__device__ __forceinline__ void rms_prewait(mvm_ctx& c, int norm, int gamma, int w) {
  if (norm != 0) prefetch_gamma(c, gamma, w);
}

template <typename Op>
__device__ __forceinline__ float rms_gemv(mvm_ctx& c, int nrows, int lora_b = -1, int aid = 0, int row0 = 0) {
  const int w = Op::w(c.ins);
  const int K = (int)bufinfo(c, w).shape[1];
  const gemv_src g = gemv_source(c, 0, w);       // before x loads (gemv_src)
  const float rstd = load_x_norm(c, Op::x(c.ins), Op::norm(c.ins) != 0, K, Op::eps(c.ins), w);
  lora_prefetch_b(c, lora_b, aid, row0, nrows, 1);  // the tile's rows of a LoRA B, if any (lora.cuh)
  gemv(c, g, nrows, K, c.s.acc);
  return rstd;
}

// y[row0 + r] = acc[r] for the tile's rows (y tagged or plain).
__device__ __forceinline__ void store_rows(mvm_ctx& c, const act_out& y, int row0, int nrows) {
  if (y.tagged) tag_release();
  for (int r = c.tid; r < nrows; r += NCT) act_store(y.p, y.tagged, row0 + r, c.s.acc[r], step_tag(c));
}
__device__ __forceinline__ void store_rows(mvm_ctx& c, int y_buf, int row0, int nrows) {
  store_rows(c, out_of(c, y_buf), row0, nrows);
}
