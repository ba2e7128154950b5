// What the expert opcodes share: the expert ids a ROUTE task of the same step wrote (the wait covers
// them), each checked against the stack it indexes.
#pragma once
#include "device.cuh"

// ids[j], or -1 after failing the launch with a dump naming the id when it is outside the stack w.
__device__ __forceinline__ int expert_id(mvm_ctx& c, int ids_buf, int j, int w_buf) {
  const int e = __ldcg((const int*)buf(c, ids_buf) + j);
  return input_in_range(c, e, bufinfo(c, w_buf).shape[0]) ? e : -1;
}
