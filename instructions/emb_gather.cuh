// EMB_GATHER: e[b, f] = table[(ids[b, f] + 1) % rows(table)] for batch rows b0 .. b0 + nb
#pragma once
#include "device.cuh"

template <typename T>
__device__ void gather_rows(mvm_ctx& c, const T* table, const int* ids, float* e, long n_rows, int D, int S, int f,
                            int b0, int nb) {
  for (int k = c.tid; k < nb * D; k += NCT) {
    const int b = b0 + k / D, i = k % D;
    const long row = ((long)__ldcg(ids + (long)b * S + f) + 1) % n_rows;
    e[((long)b * S + f) * D + i] = to_f(table[row * D + i]);
  }
}

__device__ bool op_emb_gather(mvm_ctx& c) {
  using Op = EMB_GATHER;
  const int tb = Op::table(c.ins), ib = Op::ids(c.ins);
  const long n_rows = bufinfo(c, tb).shape[0];
  const int D = (int)bufinfo(c, tb).shape[1], S = (int)bufinfo(c, ib).shape[1];
  const int f = Op::feature(c.ins), b0 = Op::b0(c.ins), nb = Op::nb(c.ins);
  const int* ids = (const int*)buf(c, ib);
  for (int b = b0; b < b0 + nb; ++b)             // the host refuses negative ids; a dump if one slips by
    if (!input_in_range(c, __ldcg(ids + (long)b * S + f), 1L << 31)) return false;
  float* e = (float*)buf(c, Op::e(c.ins));
  if (bufinfo(c, tb).dtype == MVM_BF16)
    gather_rows(c, (const __nv_bfloat16*)buf(c, tb), ids, e, n_rows, D, S, f, b0, nb);
  else
    gather_rows(c, (const float*)buf(c, tb), ids, e, n_rows, D, S, f, b0, nb);
  return true;
}
