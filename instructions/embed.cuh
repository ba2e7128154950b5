// EMBED: x[col0:col0+ncols] = scale * table[token, col0:col0+ncols]; with LoRA on layer 0's q/k/v, the
// partial product of their A with these columns.
#pragma once
#include "lora.cuh"
#include "tagged.cuh"

template <typename T>
__device__ void embed_cols(mvm_ctx& c, const T* table, float* x, bool tagged, long row, int col0, int ncols,
                           float scale) {
  if (tagged) tag_release();
  for (int i = c.tid; i < ncols; i += NCT) act_store(x, tagged, col0 + i, to_f(table[row + col0 + i]) * scale, step_tag(c));
}

__device__ bool op_embed(mvm_ctx& c) {
  const int tb = EMBED::table(c.ins);
  const int aid = lora_begin(c, EMBED::adapter(c.ins));
  const int token = input_token(c);
  const long vocab = bufinfo(c, tb).shape[0], dim = bufinfo(c, tb).shape[1];
  if (!input_in_range(c, token, vocab)) return false;
  float* x = (float*)buf(c, EMBED::x(c.ins));
  const int col0 = EMBED::col0(c.ins), ncols = EMBED::ncols(c.ins);
  const float scale = EMBED::scale(c.ins);
  lora_prefetch_a(c, EMBED::next_a(c.ins), aid, col0, ncols);
  const bool xt = buf_tagged(c, EMBED::x(c.ins));
  if (bufinfo(c, tb).dtype == MVM_BF16)
    embed_cols(c, (const __nv_bfloat16*)buf(c, tb), x, xt, (long)token * dim, col0, ncols, scale);
  else
    embed_cols(c, (const float*)buf(c, tb), x, xt, (long)token * dim, col0, ncols, scale);
  if (EMBED::next_a(c.ins) < 0) return true;
  consumer_sync();
  return lora_produce(c, EMBED::next_a(c.ins), EMBED::next_u(c.ins), aid, EMBED::lora_t(c.ins), col0,
                      nullptr, EMBED::x(c.ins), x, col0, ncols, EMBED::next_gamma(c.ins));
}
