// ATTN_COMBINE: merge the blocks of one KV head in block order, for its group's query heads [q0, q0 +
// q_heads); with LoRA on the o-projection, the partial product of its A with those rows.
#pragma once
#include "attention.cuh"
#include "lora.cuh"

__device__ bool op_attn_combine(mvm_ctx& c) {
  const int pb = ATTN_COMBINE::part(c.ins);
  const mvm_buffer_t& pinfo = bufinfo(c, pb);
  const int nblk = (int)pinfo.shape[1], G = (int)pinfo.shape[2], W = (int)pinfo.shape[3];
  const int h = ATTN_COMBINE::kv_head(c.ins), q0 = ATTN_COMBINE::q0(c.ins);
  const int gn = ATTN_COMBINE::q_heads(c.ins) ? ATTN_COMBINE::q_heads(c.ins) : G - q0;
  const int n = gn * (W - 2), o0 = (h * G + q0) * (W - 2);
  const int aid = lora_begin(c, ATTN_COMBINE::adapter(c.ins));    // used after the combine
  float* attn = (float*)buf(c, ATTN_COMBINE::attn(c.ins));
  const uint32_t tag = buf_tagged(c, ATTN_COMBINE::attn(c.ins)) ? step_tag(c) : 0u;
  const int na = ATTN_COMBINE::next_a(c.ins);     // read before the work (tagged.cuh: act_out)
  combine_heads(c, pb, nblk, G, W, h, h + 1, q0, gn, attn, c.s.xs, 0, tag);   // ends synced
  if (na < 0) return true;
  return lora_produce(c, na, ATTN_COMBINE::next_u(c.ins), aid,
                      ATTN_COMBINE::lora_t(c.ins), o0, nullptr, ATTN_COMBINE::attn(c.ins), attn, o0, n);
}
