// KV_QUANT: once every producer of the new row has written it and its partial amax (RMS_LINEAR_AMAX),
// KV head kv_head's rows appended at position pos as e4m3 codes of y / scale, scale = amax / 448 over
// the whole row, the scale beside them (instructions/kv_quant.py).
#pragma once
#include "codes.cuh"

__device__ bool op_kv_quant(mvm_ctx& c) {
  using Op = KV_QUANT;
  const int cb = Op::cache(c.ins), ab = Op::amax(c.ins), h = Op::kv_head(c.ins);
  const long cap = bufinfo(c, cb).shape[1];
  const int hd = (int)bufinfo(c, cb).shape[2], n = (int)bufinfo(c, ab).shape[0];
  const int pos = input_pos(c);
  if (!input_in_range(c, pos, cap)) return false;
  const float* amax = (const float*)buf(c, ab);
  float a = 0.f;                                 // every warp reduces the partials (one a tile, in L2)
  for (int i = c.lane; i < n; i += 32) a = fmaxf(a, __ldcg(amax + i));
  for (int o = 16; o > 0; o >>= 1) a = fmaxf(a, __shfl_xor_sync(0xffffffffu, a, o));
  const float s = __fdiv_rn(a, 448.f);
  const float* y = (const float*)buf(c, Op::y(c.ins)) + (long)h * hd;
  __nv_fp8_storage_t* codes = (__nv_fp8_storage_t*)buf(c, cb) + ((long)h * cap + pos) * hd;
  const int sw = kv_xor(pos, kv_swizzle<mvm_e4m3>(hd)) << 4;      // the row's chunks swizzled (device.cuh)
  for (int e = c.tid; e < hd; e += NCT)
    codes[e ^ sw] = a > 0.f ? __nv_cvt_float_to_fp8(__fdiv_rn(__ldcg(y + e), s), __NV_SATFINITE, __NV_E4M3) : 0;
  if (c.tid == 0) ((float*)buf(c, Op::scale(c.ins)))[(long)h * cap + pos] = s;
  return true;
}
