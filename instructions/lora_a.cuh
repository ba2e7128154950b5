// LORA_A: u[lora_t] = A[id, :, col0:col0+n] (g v)[col0:col0+n] (instructions/lora_a.py). The slice of A
// lands in shared memory while the task waits for v; after the wait, v is loaded (polled where tagged),
// each warp takes rows of the slice and each lane 16-byte pieces of a row, one warp sum a row.
#pragma once
#include "lora.cuh"

// xs: the slice of A (J rows of n elements, rows packed), then v's n elements from this float on.
__device__ __forceinline__ int lora_a_vs(int J, int n, int isz) { return ((J * n * isz + 15) / 16) * 4; }

// Before the wait: the slice of A[id] copied into xs (cp.async; the body waits for it). Nothing for id 0;
// an id out of range is left to the body, which fails the launch.
__device__ __forceinline__ void lora_a_prewait(mvm_ctx& c, int ab, int idb, int col0, int n) {
  const int id = lora_begin(c, idb);
  const mvm_buffer_t& ai = bufinfo(c, ab);
  if (id <= 0 || id >= ai.shape[0]) return;
  const int isz = elem_bytes(ai.dtype), J = (int)ai.shape[1], P = n * isz / 16;
  const long L = ai.shape[2];
  const char* a = (const char*)buf(c, ab) + ((long)id * J * L + col0) * isz;
  char* s = reinterpret_cast<char*>(c.s.xs);
  for (int i = c.tid; i < J * P; i += NCT) {
    const int j = i / P, q = i - j * P;
    cp_async16(s + ((long)j * P + q) * 16, a + (long)j * L * isz + q * 16);
  }
}

__device__ __forceinline__ float lora_a_piece(const uint4& w, const float* x, bool bf16) {
  if (!bf16) {
    const float4 v = *reinterpret_cast<const float4*>(x);
    return fmaf(__uint_as_float(w.w), v.w, fmaf(__uint_as_float(w.z), v.z,
                fmaf(__uint_as_float(w.y), v.y, __uint_as_float(w.x) * v.x)));
  }
  const float4 x0 = *reinterpret_cast<const float4*>(x), x1 = *reinterpret_cast<const float4*>(x + 4);
  const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&w);
  const float2 a = __bfloat1622float2(h[0]), b = __bfloat1622float2(h[1]);
  const float2 d = __bfloat1622float2(h[2]), e = __bfloat1622float2(h[3]);
  float s = a.x * x0.x, t = d.x * x1.x;
  s = fmaf(a.y, x0.y, s); t = fmaf(d.y, x1.y, t);
  s = fmaf(b.x, x0.z, s); t = fmaf(e.x, x1.z, t);
  s = fmaf(b.y, x0.w, s); t = fmaf(e.y, x1.w, t);
  return s + t;
}

__device__ bool op_lora_a(mvm_ctx& c) {
  const int ab = LORA_A::a(c.ins);
  const int id = lora_begin(c, LORA_A::adapter(c.ins));
  if (!lora_id_ok(c, id, ab)) return false;
  if (id == 0) return true;
  const mvm_buffer_t& ai = bufinfo(c, ab);
  const int J = (int)ai.shape[1], n = LORA_A::ncols(c.ins), col0 = LORA_A::col0(c.ins);
  const int isz = elem_bytes(ai.dtype);
  const bool bf16 = ai.dtype == MVM_BF16;
  float* vs = c.s.xs + lora_a_vs(J, n, isz);
  const int vb = LORA_A::v(c.ins), gb = LORA_A::gamma(c.ins);
  const float* v = (const float*)buf(c, vb);
  const bool vt = buf_tagged(c, vb);
  for (int i = c.tid * 4; i < n; i += NCT * 4) {
    float4 x = vt ? act4_tagged(c, vb, reinterpret_cast<const uint64_t*>(v), col0 + i)
                  : __ldcg(reinterpret_cast<const float4*>(v + col0 + i));
    if (gb >= 0) {
      x.x *= weight_at(c, gb, col0 + i);
      x.y *= weight_at(c, gb, col0 + i + 1);
      x.z *= weight_at(c, gb, col0 + i + 2);
      x.w *= weight_at(c, gb, col0 + i + 3);
    }
    *reinterpret_cast<float4*>(vs + i) = x;
  }
  if (vt) tag_acquire();
  cp_async_wait_all();
  consumer_sync();
  const int ub = LORA_A::u(c.ins);
  const bool ut = buf_tagged(c, ub);
  const uint32_t tag = step_tag(c);
  float* U = (float*)buf(c, ub) + (ut ? 2 : 1) * (long)LORA_A::lora_t(c.ins) * J;
  const int P = n * isz / 16, per = 16 / isz;    // pieces of a row, elements of a piece
  if (ut) tag_release();
  for (int j = c.warp; j < J; j += NCW) {
    const char* row = reinterpret_cast<const char*>(c.s.xs) + (long)j * P * 16;
    float s = 0.f;
    for (int q = c.lane; q < P; q += 32)
      s += lora_a_piece(*reinterpret_cast<const uint4*>(row + q * 16), vs + q * per, bf16);
    s = warp_sum(s);
    if (c.lane == 0) act_store(U, ut, j, s, tag);
  }
  return true;
}
