// EMBED: x[col0:col0+ncols] = table[token, col0:col0+ncols]
#pragma once
#include "../vm/kernel/device.cuh"

template <typename T>
__device__ void embed_impl(mvm_ctx& c, const T* table, float* x, long row, int col0, int ncols) {
  for (int i = c.tid; i < ncols; i += NCT) x[col0 + i] = to_f(table[row + col0 + i]);
}

__device__ bool op_embed(mvm_ctx& c) {
  const int tb = c.ins->inputs[0];
  const int token = input_token(c);
  const long vocab = bufinfo(c, tb).shape[0], dim = bufinfo(c, tb).shape[1];
  if (token < 0 || token >= vocab) {
    if (c.tid == 0) mvm_fail(c.a, MVM_ERR_BAD_INPUT, c.block, c.qpos, c.ins, -1, (uint32_t)token, (uint32_t)vocab);
    return false;
  }
  float* x = (float*)buf(c, c.ins->outputs[0]);
  if (bufinfo(c, tb).dtype == MVM_BF16)
    embed_impl(c, (const __nv_bfloat16*)buf(c, tb), x, (long)token * dim, pint(c, 0), pint(c, 1));
  else
    embed_impl(c, (const float*)buf(c, tb), x, (long)token * dim, pint(c, 0), pint(c, 1));
  return true;
}
