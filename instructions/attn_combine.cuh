// ATTN_COMBINE: merge the blocks of one KV head in block order.
#pragma once
#include "attention.cuh"

__device__ bool op_attn_combine(mvm_ctx& c) {
  const int pb = ATTN_COMBINE::part(c.ins);
  const mvm_buffer_t& pinfo = bufinfo(c, pb);
  const int nblk = (int)pinfo.shape[1], G = (int)pinfo.shape[2], W = (int)pinfo.shape[3];
  const int h = ATTN_COMBINE::kv_head(c.ins);
  combine_heads(c, (const float*)buf(c, pb), nblk, G, W, h, h + 1, (float*)buf(c, ATTN_COMBINE::attn(c.ins)), c.s.xs,
                false);
  return true;
}
