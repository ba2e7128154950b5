// Weight codes the GEMV decodes in registers: e4m3 (F8E4M3 weights), e2m1 (NVFP4, E2M1 weights) and
// int4 with zero points (AWQ, U4 weights),
// and their dot products against activations in shared memory (instructions/gemv_core.cuh).
#pragma once
#include <cuda_fp8.h>
#include <type_traits>
#include "device.cuh"

// An e4m3 weight code, as stored (F8E4M3 buffers: each row times its f32 scale, applied to the row's sum).
struct mvm_e4m3 {
  uint8_t bits;
};
// An e4m3 weight code of an F8E4M3 weight with a block_scale buffer: each 128 x 128 block of the matrix
// times its f32 scale (the Hugging Face "fp8" format's weight_scale_inv), applied to each 16-code
// piece's sum. Row-per-warp path, and the register path for rows of one chunk (gemv_e4m3_blocks).
struct mvm_e4m3b {
  uint8_t bits;
};
// Two NVFP4 (e2m1) weight codes, element 2i in the low nibble (E2M1 buffers: each block of 16 codes
// times its e4m3 block scale, each row's sum times its f32 scale). Row-per-warp path (gemv_xreg: K = 2048).
struct mvm_e2m1x2 {
  uint8_t bits;
};
// Two int4 (AWQ) weight codes 0..15, element 2i in the low nibble (U4 buffers: each group of 128 codes
// as (code - zero) * scale, an f16 pair per group in the weight's block_scale buffer). Row-per-warp
// path (gemv_xreg: K = 2048 and 4096).
struct mvm_u4x2 {
  uint8_t bits;
};
// Two MXFP4 (e2m1) weight codes, element 2i in the low nibble (E2M1 buffers whose block_scale is E8M0:
// each block of 32 codes, one piece, times 2^(e - 127); no row scales). Row-per-warp path (gemv_xreg: K = 2048).
struct mvm_mx4x2 {
  uint8_t bits;
};
// Two e2m1 codes of an NVFP4 KV cache row, element 2i in the low nibble (E2M1 KV_CACHE buffers: each
// block of 16 elements times its e4m3 block scale, each row times its f32 scale; instructions/kv_quant.py).
// Rows are not swizzled.
struct mvm_e2m1kv {
  uint8_t bits;
};
template <> __device__ __forceinline__ int kv_swizzle<mvm_e2m1kv>(int) { return 0; }
// KV cache row lengths in units of T (two e2m1 codes a byte).
template <typename T> __device__ __forceinline__ int kv_units(int hd) {
  return std::is_same<T, mvm_e2m1kv>::value ? hd / 2 : hd;
}

// Two e2m1 codes (bits 0..3 and 16..19 of u) as an f16x2 of the codes times 2^-14: each nibble's
// exponent and mantissa bits land on the f16's bits 9..11 and its sign on bit 15 (exact; the codes 0 and
// 0.5 come out as f16 zero and subnormal).
__device__ __forceinline__ uint32_t e2m1x2_f16x2_raw(uint32_t u) {
  return ((u & 0x00070007u) << 9) | ((u & 0x00080008u) << 12);
}
// The f16x2 of codes k and k + 4 of word u (nibbles k and k + 4, e2m1x2_f16x2_raw's bits) times m.
__device__ __forceinline__ uint32_t e2m1_pair(uint32_t u, int k, __half2 m) {
  const uint32_t h = e2m1x2_f16x2_raw(u >> (4 * k));
  const __half2 r = __hmul2(*reinterpret_cast<const __half2*>(&h), m);
  return *reinterpret_cast<const uint32_t*>(&r);
}

// Elements per 16-byte piece of a weight type.
template <typename T> struct piece_of { static constexpr int EPP = 16 / sizeof(T); };
template <> struct piece_of<mvm_e2m1x2> { static constexpr int EPP = 32; };
template <> struct piece_of<mvm_u4x2> { static constexpr int EPP = 32; };
template <> struct piece_of<mvm_mx4x2> { static constexpr int EPP = 32; };

// Four e4m3 codes (one 32-bit word, code 0 in the low byte) as floats: the hardware's e4m3x2 -> f16x2
// conversion, then f16 -> f32. (Building the f32 bits with integer operations, exact too, was slower:
// llama-7b-32k 3.857 against 3.638 ms, H100.)
__device__ __forceinline__ float4 e4m3x4(uint32_t u) {
  const __half2_raw lo = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(u & 0xffffu), __NV_E4M3);
  const __half2_raw hi = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(u >> 16), __NV_E4M3);
  const float2 a = __half22float2(__half2(lo)), b = __half22float2(__half2(hi));
  return make_float4(a.x, a.y, b.x, b.y);
}
// A piece of 16 codes against x[j] = its activations 4j .. 4j+4, as two FMA chains (both paths).
__device__ __forceinline__ float dot_e4m3(const uint4& w, const float4 (&x)[4]) {
  const uint32_t u[4] = {w.x, w.y, w.z, w.w};
  float s = 0.f, t = 0.f;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const float4 v = e4m3x4(u[j]);
    float& a = (j & 1) ? t : s;
    a = fmaf(v.x, x[j].x, a); a = fmaf(v.y, x[j].y, a); a = fmaf(v.z, x[j].z, a); a = fmaf(v.w, x[j].w, a);
  }
  return s + t;
}
// Eight e2m1 codes (one 32-bit word, element 0 in the low nibble) against their activations a
// (elements 0..3) and b (4..7), added to s. Codes k and k + 4 become one f16x2 whose values are the
// codes' times 2^-14: each nibble's exponent and mantissa bits land on the f16's bits 9..11 and its
// sign on bit 15 (exact; the codes 0 and 0.5 come out as f16 zero and subnormal). The caller scales
// by 2^14.
__device__ __forceinline__ float dot_e2m1x8(uint32_t u, const float4& a, const float4& b, float s) {
  const float xa[4] = {a.x, a.y, a.z, a.w}, xb[4] = {b.x, b.y, b.z, b.w};
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const uint32_t h = e2m1x2_f16x2_raw(u >> (4 * k));
    const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&h));
    s = fmaf(f.x, xa[k], s);
    s = fmaf(f.y, xb[k], s);
  }
  return s;
}
// A piece of 16 e4m3 codes against its activations in shared memory (at xa + m hb: elements 4m .. 4m+4).
__device__ __forceinline__ float dot_e4m3_s(const uint4& w, uint32_t xa, int hb) {
  const float4 xv[4] = {ldsf4(xa), ldsf4(xa + hb), ldsf4(xa + 2 * hb), ldsf4(xa + 3 * hb)};
  return dot_e4m3(w, xv);
}
// A piece of 32 e2m1 codes against its activations in shared memory (at xa + m hb: elements 4m ..
// 4m+4): the sums of its halves (codes 0..15 and 16..31), times 2^-14.
// A 32-code piece's activations from shared memory: run m (elements 4m .. 4m+4) at xa + m hb.
__device__ __forceinline__ void load_runs8(float4 (&xv)[8], uint32_t xa, int hb) {
#pragma unroll
  for (int m = 0; m < 8; ++m) xv[m] = ldsf4(xa + m * hb);
}
__device__ __forceinline__ float2 e2m1_halves(const uint4& w, const float4 (&xv)[8]) {
  return make_float2(dot_e2m1x8(w.y, xv[2], xv[3], dot_e2m1x8(w.x, xv[0], xv[1], 0.f)),
                     dot_e2m1x8(w.w, xv[6], xv[7], dot_e2m1x8(w.z, xv[4], xv[5], 0.f)));
}
__device__ __forceinline__ float2 e2m1_halves(const uint4& w, uint32_t xa, int hb) {
  float4 xv[8];
  load_runs8(xv, xa, hb);
  return e2m1_halves(w, xv);
}
// A piece of 32 e2m1 codes (two blocks of 16) against its activations xv and its blocks' e4m3 scales
// sc2 (block 0 in the low byte), times 2^-14.
__device__ __forceinline__ float dot_e2m1(const uint4& w, const float4 (&xv)[8], uint32_t sc2) {
  const float2 h = e2m1_halves(w, xv);
  const float s0 = h.x, s1 = h.y;
  const __half2_raw r = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)sc2, __NV_E4M3);
  const float2 bs = __half22float2(__half2(r));
  return fmaf(s0, bs.x, s1 * bs.y);
}
__device__ __forceinline__ float dot_e2m1(const uint4& w, uint32_t xa, int hb, uint32_t sc2) {
  float4 xv[8];
  load_runs8(xv, xa, hb);
  return dot_e2m1(w, xv, sc2);
}
// Eight int4 codes (one 32-bit word, element 0 in the low nibble) minus their zero point against their
// activations a (elements 0..3) and b (4..7), added to s. Codes k and k + 4 become one f16x2 1024 + code
// (the nibbles under the exponent of 1024), minus zz = 1024 + zero: the integers code - zero, exact.
__device__ __forceinline__ float dot_u4x8(uint32_t u, const float4& a, const float4& b, __half2 zz, float s) {
  const float xa[4] = {a.x, a.y, a.z, a.w}, xb[4] = {b.x, b.y, b.z, b.w};
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const uint32_t h = ((u >> (4 * k)) & 0x000f000fu) | 0x64006400u;
    const float2 f = __half22float2(__hsub2(*reinterpret_cast<const __half2*>(&h), zz));
    s = fmaf(f.x, xa[k], s);
    s = fmaf(f.y, xb[k], s);
  }
  return s;
}
// A piece of 32 int4 codes (within one group of 128) against its activations in shared memory (at xa +
// m hb: elements 4m .. 4m+4) and its group's word g: f16 scale in the low half, f16 zero point in the
// high half.
__device__ __forceinline__ float dot_u4(const uint4& w, const float4 (&xv)[8], uint32_t g) {
  const __half2 sz = *reinterpret_cast<const __half2*>(&g);
  const __half2 zz = __half2half2(__hadd(__high2half(sz), __ushort_as_half((unsigned short)0x6400u)));
  const float s0 = dot_u4x8(w.y, xv[2], xv[3], zz, dot_u4x8(w.x, xv[0], xv[1], zz, 0.f));
  const float s1 = dot_u4x8(w.w, xv[6], xv[7], zz, dot_u4x8(w.z, xv[4], xv[5], zz, 0.f));
  return (s0 + s1) * __low2float(sz);
}
__device__ __forceinline__ float dot_u4(const uint4& w, uint32_t xa, int hb, uint32_t g) {
  float4 xv[8];
  load_runs8(xv, xa, hb);
  return dot_u4(w, xv, g);
}
// A piece of 32 mxfp4 codes (one block) against its activations in shared memory (at xa + m hb:
// elements 4m .. 4m+4) and its biased e8m0 exponent e: the codes' sum (dot_e2m1x8: 2^-14 of their
// values) times 2^14 and 2^(e - 127), each exact (e 0 is 2^-127, an f32 subnormal).
__device__ __forceinline__ float dot_mx(const uint4& w, const float4 (&xv)[8], uint32_t e) {
  const float2 h = e2m1_halves(w, xv);
  const float p2 = __uint_as_float(e ? e << 23 : 0x00400000u);
  return (h.x + h.y) * 16384.f * p2;
}
__device__ __forceinline__ float dot_mx(const uint4& w, uint32_t xa, int hb, uint32_t e) {
  float4 xv[8];
  load_runs8(xv, xa, hb);
  return dot_mx(w, xv, e);
}
// A 32-code piece of T (mvm_e2m1x2, mvm_u4x2 or mvm_mx4x2) against its activations xv and its scale word.
template <typename T>
__device__ __forceinline__ float dot_codes32(const uint4& w, const float4 (&xv)[8], uint32_t sc) {
  if constexpr (std::is_same<T, mvm_e2m1x2>::value) return dot_e2m1(w, xv, sc);
  else if constexpr (std::is_same<T, mvm_u4x2>::value) return dot_u4(w, xv, sc);
  else return dot_mx(w, xv, sc);
}
// Piece q's scale word in sr, a row of T's scale table: NVFP4 its two blocks' e4m3 pair (16 bits), int4
// its group's f16 scale and zero (32 bits, one a 4 pieces), mxfp4 its e8m0 exponent (a byte).
template <typename T>
__device__ __forceinline__ uint32_t scale_word(const unsigned char* sr, int q) {
  if constexpr (std::is_same<T, mvm_e2m1x2>::value) return __ldg(reinterpret_cast<const uint16_t*>(sr) + q);
  else if constexpr (std::is_same<T, mvm_u4x2>::value) return __ldg(reinterpret_cast<const uint32_t*>(sr) + (q >> 2));
  else return __ldg(sr + q);
}
