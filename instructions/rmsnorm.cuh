// RMSNORM: y = gamma * x / rms(x) (the unfused ablation). The same arithmetic as a fused prologue
// (gamma into xs, then load_x), so the projections reading y compute bit-identical results.
#pragma once
#include "gemv.cuh"

__device__ bool op_rmsnorm(mvm_ctx& c) {
  const int gamma = RMSNORM::gamma(c.ins);
  const int K = (int)bufinfo(c, gamma).shape[0];
  if (bufinfo(c, gamma).dtype == MVM_BF16)
    prefetch_gamma_t(c, (const __nv_bfloat16*)buf(c, gamma), K, 0);
  else
    prefetch_gamma_t(c, (const float*)buf(c, gamma), K, 0);
  consumer_sync();
  load_x(c, (const float*)buf(c, RMSNORM::x(c.ins)), true, K, RMSNORM::eps(c.ins), 0);
  float* y = (float*)buf(c, RMSNORM::y(c.ins));
  for (int i = c.tid * 4; i < K; i += NCT * 4)
    *reinterpret_cast<float4*>(y + i) = *reinterpret_cast<const float4*>(c.s.xs + i);
  return true;
}
