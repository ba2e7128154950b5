// KV_QUANT: once every producer of the new row has written it and its partial amax (RMS_LINEAR_AMAX),
// KV head kv_head's rows appended at position pos, quantized against the whole row's amax: as e4m3
// codes of y / scale, scale = amax / 448, or as NVFP4 (e2m1 codes, an e4m3 scale per 16 elements, the
// f32 scale 1 / global), the scales beside them (instructions/kv_quant.py, core/codecs.py).
#pragma once
#include "codes.cuh"

// The e2m1 code (sign in bit 3) of x: the nearest of 0, 0.5, 1, 1.5, 2, 3, 4, 6, ties to the even code,
// saturating at 6; whatever rounds to 0 is +0 (core/codecs.py: e2m1_codes).
__device__ __forceinline__ uint32_t e2m1_code(float x) {
  const float m = fabsf(x);
  const uint32_t i = (m > 0.25f) + (m >= 0.75f) + (m > 1.25f) + (m >= 1.75f) + (m > 2.5f) + (m >= 3.5f) + (m > 5.f);
  return i | (x < 0.f && i > 0 ? 8u : 0u);
}

// vLLM's reference NVFP4 quantizer for row y of hd elements against amax a: global g = 2688 / a (1 for
// a = 0); per block of 16, its scale e4m3(g x block amax / 6) and codes e2m1(y x 1 / (scale / g)). One
// thread a block; the operations and their rounding are core/codecs.py's (nvfp4_rows), bit for bit: a
// number over a tensor is torch's reciprocal times the number (2688 / a is rn(rn(1 / a) x 2688), not
// one division). Out of line (inlined, its 16 values made the main loop spill).
__device__ __noinline__ void nvfp4_row(int tid, const float* y, int hd, float a, uint8_t* codes,
                                       __nv_fp8_storage_t* bscale, float* scale) {
  const float g = a > 0.f ? __fmul_rn(__frcp_rn(a), 448.f * 6.f) : 1.f, rg = __frcp_rn(g);
  for (int blk = tid; blk < hd / 16; blk += NCT) {
    float v[16], m = 0.f;
#pragma unroll
    for (int e = 0; e < 16; ++e) {
      v[e] = __ldcg(y + 16 * blk + e);
      m = fmaxf(m, fabsf(v[e]));
    }
    const __nv_fp8_storage_t bs =          // an all-zero block: 0, even where g is inf (a row below 8e-36)
        m > 0.f ? __nv_cvt_float_to_fp8(__fmul_rn(g, __fmul_rn(m, 1.f / 6.f)), __NV_SATFINITE, __NV_E4M3) : 0;
    const float bsf = __half2float(__half(__nv_cvt_fp8_to_halfraw(bs, __NV_E4M3)));
    const float d = __fmul_rn(bsf, rg), inv = d == 0.f ? 0.f : __frcp_rn(d);
    uint32_t w[2] = {0u, 0u};
#pragma unroll
    for (int e = 0; e < 16; ++e)
      w[e / 8] |= e2m1_code(fminf(fmaxf(__fmul_rn(v[e], inv), -6.f), 6.f)) << (4 * (e % 8));
    *reinterpret_cast<uint2*>(codes + 8 * blk) = make_uint2(w[0], w[1]);
    bscale[blk] = bs;
  }
  if (tid == 0) *scale = rg;
}

__device__ bool op_kv_quant(mvm_ctx& c) {
  using Op = KV_QUANT;
  const int cb = Op::cache(c.ins), ab = Op::amax(c.ins), h = Op::kv_head(c.ins);
  const mvm_buffer_t& info = bufinfo(c, cb);
  const long cap = info.shape[1];
  const int hd = (int)info.shape[2], n = (int)bufinfo(c, ab).shape[0];
  const int pos = input_pos(c);
  if (!input_in_range(c, pos, cap)) return false;
  const float* amax = (const float*)buf(c, ab);
  float a = 0.f;                                 // every warp reduces the partials (one a tile, in L2)
  for (int i = c.lane; i < n; i += 32) a = fmaxf(a, __ldcg(amax + i));
  for (int o = 16; o > 0; o >>= 1) a = fmaxf(a, __shfl_xor_sync(0xffffffffu, a, o));
  const float* y = (const float*)buf(c, Op::y(c.ins)) + (long)h * hd;
  float* scale = (float*)buf(c, Op::scale(c.ins)) + (long)h * cap + pos;
  if (info.dtype == MVM_E2M1) {
    nvfp4_row(c.tid, y, hd, a, (uint8_t*)buf(c, cb) + ((long)h * cap + pos) * (hd / 2),
              (__nv_fp8_storage_t*)buf(c, Op::block_scale(c.ins)) + ((long)h * cap + pos) * (hd / 16), scale);
    return true;
  }
  const float s = __fdiv_rn(a, 448.f);
  __nv_fp8_storage_t* codes = (__nv_fp8_storage_t*)buf(c, cb) + ((long)h * cap + pos) * hd;
  const int sw = kv_xor(pos, kv_swizzle<mvm_e4m3>(hd)) << 4;      // the row's chunks swizzled (device.cuh)
  for (int e = c.tid; e < hd; e += NCT)
    codes[e ^ sw] = a > 0.f ? __nv_cvt_float_to_fp8(__fdiv_rn(__ldcg(y + e), s), __NV_SATFINITE, __NV_E4M3) : 0;
  if (c.tid == 0) *scale = s;
  return true;
}
