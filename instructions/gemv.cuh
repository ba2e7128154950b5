// The GEMV every projection opcode calls: gemv() dispatches on the weights' dtype to the f32 and
// bf16 streams (instructions/gemv_core.cuh) or the packed formats' out-of-line function (e4m3, e2m1, int4;
// instructions/codes.cuh, gemv_mma.cuh, gemv_xreg.cuh).
#pragma once
#include "gemv_f8.cuh"
#include "gemv_imma.cuh"
#include "gemv_mma.cuh"
#include "gemv_xreg.cuh"
#include "load_x.cuh"

// e4m3 codes with 128 x 128 block scales (bs: the matrix's f32 scales, r0: the tile's first row in the
// matrix), out of line: one call site in gemv_packed for both paths.
__device__ __noinline__ int2 gemv_e4m3_blocks(gemv_view v, const mvm_e4m3b* w, int nrows, int K, int kp, float* acc,
                                              const float* bs, int r0) {
  return kp == 0 ? gemv_core<mvm_e4m3b>(v, w, nrows, K, acc, (const unsigned char*)bs, r0)
         : v.direct ? gemv_regs<mvm_e4m3b, 1, true>(v, w, nrows, acc, bs, r0, (K + 127) >> 7)
                    : gemv_regs<mvm_e4m3b, 1, false>(v, w, nrows, acc, bs, r0, (K + 127) >> 7);
}

// The packed streams (e4m3 with row or 128 x 128 block scales on both paths, e2m1 and int4 on the
// row-per-warp path or gemv_xreg.cuh's), one out-of-line function: their conversions would otherwise add
// their registers to every opcode that inlines a GEMV, and one call site costs the inlining opcodes fewer
// registers than one per format. sc: the weight's f32 row scales (buffer info.scale), or null; bs: its
// buffer info.block_scale, or null: an e2m1 weight's e4m3 block scales [rows, K/16] (or, mxfp4 with no
// row scales, its e8m0 exponents [rows, K/32]), an int4 weight's
// f16 (scale, zero) [rows, K/128, 2] (no row scales), an e4m3 weight's f32 scale per 128 x 128 block
// [ceil(rows/128), ceil(K/128)] (no row scales; a stack's matrices are whole blocks of rows); m: the
// matrix's first row in a stack; off: the stream's byte offset in the matrix (its first row times the
// row's bytes); dense: a 2-D weight whose activations start at xs (the 4-bit tensor-core paths take only
// those); xmode: gemv's. The tile's row scales are loaded before its rows stream and applied to their
// sums after. The loader prefetched e2m1 block scales and int4 tables into L2 (vm/kernel/loader.cuh).
__device__ __noinline__ int2 gemv_packed(gemv_view v, const void* gsrc, int nrows, int K, int kp, float* acc,
                                         const float* sc, const unsigned char* bs, long m, uint32_t off,
                                         int dt, bool dense, int xmode) {
  const int t = v.warp * 32 + v.lane;
  const bool e2m1 = dt == MVM_E2M1;
  const long row0 = off / (uint32_t)(dt == MVM_F8E4M3 ? K : K / 2);
  if (dt == MVM_U4) {                            // no row scales; the group table in bs
    const unsigned char* tb = bs + (m + row0) * (K / 32);
    MVM_IF_U4_IMMA(if (const int form = dense ? u4_imma_form(v, nrows, K, xmode) : 0)
                     return gemv_u4_imma(v, (const unsigned char*)gsrc, nrows, K, acc, tb, xmode == 1, form);)
    if (xreg_takes<mvm_u4x2>(v, nrows, K)) return gemv_xreg<mvm_u4x2>(v, (const mvm_u4x2*)gsrc, nrows, K, acc, tb);
    return gemv_core<mvm_u4x2>(v, (const mvm_u4x2*)gsrc, nrows, K, acc, tb);
  }
  if (dt == MVM_E2M1 && sc == nullptr) {         // mxfp4: no row scales; e8m0 exponents in bs
    const unsigned char* eb = bs + (m + row0) * (K / 32);
    if (xreg_takes<mvm_mx4x2>(v, nrows, K)) return gemv_xreg<mvm_mx4x2>(v, (const mvm_mx4x2*)gsrc, nrows, K, acc, eb);
    return gemv_core<mvm_mx4x2>(v, (const mvm_mx4x2*)gsrc, nrows, K, acc, eb);
  }
  if (sc == nullptr)                             // e4m3 with 128 x 128 block scales
    return gemv_e4m3_blocks(v, (const mvm_e4m3b*)gsrc, nrows, K, kp, acc, (const float*)bs, (int)(m + row0));
  sc += m + row0;
  // its row scales applied inside: the last call here (not in MVM_E2M1_MMA's builds, whose tiles it measures)
  if (e2m1 && !MVM_E2M1_MMA && xreg_takes<mvm_e2m1x2>(v, nrows, K))
    return gemv_xreg<mvm_e2m1x2>(v, (const mvm_e2m1x2*)gsrc, nrows, K, acc, bs + (m + row0) * (K / 16), sc);
  // the rows gemv_xreg leaves (by default NVFP4's of K = 4096), of a 2-D weight with x at the bottom of xs
  // (the xs a build sized to its program holds for them: instructions/tiles.py, gemv_shared)
  MVM_IF_E2M1_F8(if (e2m1 && dense && e2m1_f8_takes(v, nrows, K))
                   return gemv_e2m1_f8(v, (const unsigned char*)gsrc, nrows, K, acc, bs + (m + row0) * (K / 16), sc,
                                       xmode == 1);)
  const float s0 = t < nrows ? __ldg(sc + t) : 0.f;
  int2 rp;
  if (e2m1) {
    bs += (m + row0) * (K / 16);
    MVM_IF_E2M1_MMA(if (e2m1_mma_fits(v, dense, nrows, K)) rp = gemv_e2m1_mma(v, nrows, K, acc, bs); else)
    rp = gemv_core<mvm_e2m1x2>(v, (const mvm_e2m1x2*)gsrc, nrows, K, acc, bs);
  } else {
    const mvm_e4m3* w = (const mvm_e4m3*)gsrc;
    rp = kp == 0 ? gemv_core<mvm_e4m3>(v, w, nrows, K, acc)
         : v.direct ? gemv_regs_kp<mvm_e4m3, true>(kp, v, w, nrows, acc)
                    : gemv_regs_kp<mvm_e4m3, false>(kp, v, w, nrows, acc);
  }
  const float k = e2m1 ? 16384.f : 1.f;         // 2^14: dot_e2m1's codes are 2^-14 of their values
  for (int r = t; r < nrows; r += NCT) acc[r] *= k * (r == t ? s0 : __ldg(sc + r));
  consumer_sync();
  return rp;
}

template <bool DIRECT>
__device__ __noinline__ int2 gemv_rows_bf16(gemv_view v, const __nv_bfloat16* gsrc, int nrows, int K, float* acc);
// The longest bf16 row gemv_rows_bf16 takes (MVM_ROW_PAIRS_MAX_K): a warp holds both rows of its pair until
// it has summed them, so a pair (at most 5 stages at K = 16384) must fit the ring; longer rows keep
// gemv_core's stage-by-stage walk. By shape only, so direct loads take the same path for a row.
constexpr int ROW_PAIRS_MAX_K = MVM_ROW_PAIRS_MAX_K;
static_assert(ROW_PAIRS_MAX_K <= 16384 && (4 * ROW_PAIRS_MAX_K) / STAGE_BYTES + 2 <= STAGES,
              "a pair of rows of MVM_ROW_PAIRS_MAX_K must fit the ring");

// Consume one weight stream of nrows x K elements (the instruction's next stream in the ring, or
// straight from global memory under the direct-loads ablation): acc[r] = W[r] . xs for r < nrows.
// Warp w owns rows w, w + NCW, ...; warps walk the stream's stages independently (no block barrier
// per stage) and each hands a stage back once done with it. Per-row sums: lanes in piece order, then
// a fixed butterfly, so results are bitwise reproducible. Each lane keeps two pieces and two sums
// in flight (the loop is latency-bound: a piece is one shared-memory load and eight FMAs).
// T: f32 or bf16; the packed formats take gemv_packed (gemv below). bf16 rows of K <= ROW_PAIRS_MAX_K
// that are not whole chunks take gemv_rows_bf16 (below) instead of that walk.
template <typename T>
__device__ __forceinline__ void gemv_stream(mvm_ctx& c, const T* gsrc, int nrows, int K, int kp, float* acc,
                                            int xs_at = 0) {
  const gemv_view v{c.s.ring[0], c.s.xs + xs_at, c.s.xs + (MEGAVM_MAX_K - PART_FLOATS), smem_addr(&c.s.full[0]),
                    smem_addr(&c.s.empty[0]), c.stage, c.phase, c.warp, c.lane, c.direct};
  int2 rp;
  if (kp != 0) {
    rp = c.direct ? gemv_regs_kp<T, true>(kp, v, gsrc, nrows, acc) : gemv_regs_kp<T, false>(kp, v, gsrc, nrows, acc);
  } else if constexpr (std::is_same<T, __nv_bfloat16>::value && MVM_ROW_PAIRS) {
    if (K <= ROW_PAIRS_MAX_K)
      rp = c.direct ? gemv_rows_bf16<true>(v, gsrc, nrows, K, acc) : gemv_rows_bf16<false>(v, gsrc, nrows, K, acc);
    else
      rp = gemv_core<T>(v, gsrc, nrows, K, acc);
  } else {
    rp = gemv_core<T>(v, gsrc, nrows, K, acc);
  }
  c.stage = rp.x;
  c.phase = (uint32_t)rp.y;
}

// Where stream si's next run starts in global memory (the direct-loads path reads it there): the
// stream's byte offset selects the tile's first row, `expert` the matrix of a stack [experts, rows, K].
// The matrix's bytes by multiplication: a 64-bit division here cost EXPERT_DOWN, which computes this
// once per chosen expert, about 14% of its time (ncu, docs/moe.md).
__device__ __forceinline__ const unsigned char* stream_base(const mvm_ctx& c, int si, int w_buffer, int expert) {
  const mvm_buffer_t& info = bufinfo(c, w_buffer);
  const unsigned char* run = (const unsigned char*)buf(c, w_buffer) + c.ins->streams[si].byte_offset;
  if (!expert) return run;
  const int eb = elem_bytes(info.dtype);          // 0: two codes a byte
  const uint64_t matrix = (uint64_t)info.shape[1] * info.shape[2];
  return run + (uint64_t)expert * (eb ? matrix * eb : matrix / 2);
}

// EXPERT_DOWN's k chosen experts back to back, bf16 (or f32) rows on the row-per-warp path, h[j] at
// xs + j K: acc[r] += w[j] * (W[ids[j]][r] . h[j]) for j in order, each row by the same warp, with no
// block barrier between experts or at the end (the caller syncs once). run0: the stream's first row
// in the stack's matrix 0, matrix: a matrix's bytes (the direct-loads path reads global memory there).
// Out of line, one call a task: inlined, its copy of the row loop made the other opcodes' code slower
// (llama-1b 0.8%); called once per expert, the calls cost what the barriers had (docs/moe.md).
__device__ __noinline__ int2 gemv_experts_add(gemv_view v, const unsigned char* run0, uint64_t matrix, const int* ids,
                                              const float* w, int k, int nrows, int K, float* acc, bool bf16) {
  float* const xs = v.xs;
  for (int j = 0; j < k; ++j) {
    v.xs = xs + j * K;
    const unsigned char* g = v.direct ? run0 + (uint64_t)ids[j] * matrix : nullptr;
    const int2 rp = bf16 ? gemv_core<__nv_bfloat16, true>(v, (const __nv_bfloat16*)g, nrows, K, acc, nullptr, 0, w[j])
                         : gemv_core<float, true>(v, (const float*)g, nrows, K, acc, nullptr, 0, w[j]);
    v.stage = rp.x;
    v.phase = (uint32_t)rp.y;
  }
  return make_int2(v.stage, (int)v.phase);
}

// EXPERT_DOWN's k chosen experts through the ring, bf16 rows of F <= 256 P columns (P pieces a lane),
// at most two rows a warp (nrows <= 2 NCW): warp w owns rows w and w + NCW of every expert. Each run
// starts on a fresh stage (the loader copies a run in stage-sized pieces), so an expert's rows sit at
// fixed offsets from its first stage. Two experts a trip: the warp waits for both runs, loads its
// lanes' activations of both h vectors and its rows' pieces by shared address, then sums the four
// rows in one butterfly (warp_sum_rows<4>) and adds them as w[j] * sum in expert order. A row's bits
// depend on F and the lane only (lane l's pieces l, l + 32, ... in one chain), not on where the
// stages split it. The row-per-warp loop (gemv_experts_add) spent ~100 instructions a pair of pieces
// on its stage and row bookkeeping (ncu, docs/moe.md).
template <int P>
__device__ __noinline__ int2 gemv_experts_pairs(gemv_view v, const float* w, int k, int nrows, int F, float* acc) {
  constexpr uint32_t RING = (uint32_t)STAGES * STAGE_BYTES;
  const int np = F >> 3, half = F >> 1;
  const uint32_t ring0 = smem_addr(v.ring), xs0 = smem_addr(v.xs), rowb = 2u * (uint32_t)F;
  const int nst = (int)((nrows * rowb + STAGE_BYTES - 1) / STAGE_BYTES);   // stages of one run
  const int ra = v.warp, rb = v.warp + NCW;
  const bool has_a = ra < nrows, has_b = rb < nrows;
  float ta = has_a ? acc[ra] : 0.f, tb = has_b ? acc[rb] : 0.f;
  for (int j = 0; j < k; j += 2) {
    const bool two = j + 1 < k;
    // wait for both runs' stages (every warp waits for every stage it will hand back)
    int st = v.stage;
    uint32_t ph = v.phase;
    for (int s = 0; s < (two ? 2 : 1) * nst; ++s) {
      while (!mbar_try_wait(v.full0 + 8 * st, ph)) {}
      if (++st == STAGES) { st = 0; ph ^= 1u; }
    }
    // a lane's pieces one at a time, not unrolled: the first trip of each task runs on cold code, and the
    // unrolled loop (about 760 instructions at three pieces a lane, against about 430) cost the down tile
    // about 0.4 us (docs/performance.md, session 55). The sums and their order are the same.
    float s4[4] = {0.f, 0.f, 0.f, 0.f};          // (a, j), (b, j), (a, j + 1), (b, j + 1)
#pragma unroll 1
    for (int i = 0; i < P; ++i) {
      const int q = v.lane + 32 * i;
#pragma unroll
      for (int u = 0; u < 2; ++u) {
        const uint32_t run = (uint32_t)(v.stage + u * nst) * STAGE_BYTES;   // may pass the ring's end
        const uint32_t xj = xs0 + 4u * (uint32_t)((j + u) * F);
        const bool on = q < np && (u == 0 || two);
        uint32_t la = run + (uint32_t)ra * rowb + 16u * q, lb = la + (uint32_t)NCW * rowb;
        la = la >= RING ? la - RING : la;
        lb = lb >= RING ? lb - RING : lb;
        const uint4 wa = on && has_a ? lds128(ring0 + la) : make_uint4(0, 0, 0, 0);
        const uint4 wb = on && has_b ? lds128(ring0 + lb) : make_uint4(0, 0, 0, 0);
        const float4 x0 = on ? ldsf4(xj + 16u * q) : make_float4(0.f, 0.f, 0.f, 0.f);
        const float4 x1 = on ? ldsf4(xj + 4u * half + 16u * q) : make_float4(0.f, 0.f, 0.f, 0.f);
        s4[2 * u] += dot16x(wa, x0, x1);
        s4[2 * u + 1] += dot16x(wb, x0, x1);
      }
    }
    int row;
    const float tot = warp_sum_rows<4>(s4, v.lane, row);   // lanes 8 row .. 8 row + 7 hold s4[row]'s
    const float aj = __shfl_sync(0xffffffffu, tot, 0), bj = __shfl_sync(0xffffffffu, tot, 8);
    const float aj1 = __shfl_sync(0xffffffffu, tot, 16), bj1 = __shfl_sync(0xffffffffu, tot, 24);
    ta = __fmaf_rn(w[j], aj, ta);
    tb = __fmaf_rn(w[j], bj, tb);
    if (two) {
      ta = __fmaf_rn(w[j + 1], aj1, ta);
      tb = __fmaf_rn(w[j + 1], bj1, tb);
    }
    __syncwarp();
    for (int s = 0; s < (two ? 2 : 1) * nst; ++s) {   // hand the runs' stages back
      if (v.lane == 0) mbar_arrive(v.empty0 + 8 * v.stage);
      if (++v.stage == STAGES) { v.stage = 0; v.phase ^= 1u; }
    }
  }
  if (v.lane == 0 && has_a) acc[ra] = ta;
  if (v.lane == 0 && has_b) acc[rb] = tb;
  return make_int2(v.stage, (int)v.phase);
}

// The row-per-warp path for bf16 rows (K not whole 4 KiB chunks): acc[r] = W[r] . xs. Warp w takes the
// adjacent rows 2w and 2w + 1, then 2w + 2 NCW and 2w + 2 NCW + 1, ...: it hands back the stages
// before a pair, waits for the pair's stages, reads both rows' pieces by shared address (a row may
// wrap from the ring's last stage to its first) and sums the two in one butterfly (warp_sum_rows<2>).
// Lane l takes pieces l, l + 32, ... of a row in two alternating sums, so a row's bits depend on K
// and the lane only: the same with direct loads (DIRECT: from global memory, no ring) and on every
// build. A pair spans at most 5 stages of 16 KiB (K <= ROW_PAIRS_MAX_K <= 16384), fewer than any ring holds.
template <bool DIRECT>
__device__ __noinline__ int2 gemv_rows_bf16(gemv_view v, const __nv_bfloat16* gsrc, int nrows, int K, float* acc) {
  constexpr uint32_t RING = (uint32_t)STAGES * STAGE_BYTES;
  const int np = K >> 3;
  const uint32_t ring0 = smem_addr(v.ring), xs0 = smem_addr(v.xs), rowb = 2u * (uint32_t)K, hb = rowb;   // hb: K/2 floats
  const int total = (int)(((uint32_t)nrows * rowb + STAGE_BYTES - 1) / STAGE_BYTES);
  const uint32_t base = (uint32_t)v.stage * STAGE_BYTES;
  int waited = 0, released = 0;                  // the stream's stages this warp has waited for, handed back
  int ws = v.stage, rs = v.stage;                // their ring positions
  uint32_t wph = v.phase, rph = v.phase;
  auto wait_to = [&](int n) {
    for (; waited < n; ++waited) {
      while (!mbar_try_wait(v.full0 + 8 * ws, wph)) {}
      if (++ws == STAGES) { ws = 0; wph ^= 1u; }
    }
  };
  // Every warp arrives once on every stage of the stream, and only on a stage that has landed (an early
  // arrival would count toward the stage's previous lap). Each stage is handed back as soon as it has
  // landed, not after the last one before the pair: a warp skips 2 (NCW - 1) rows a trip, more stages
  // than the ring holds for long rows, and holding them all would wait on its own hand-back.
  auto release_to = [&](int n) {
    __syncwarp();
    for (; released < n; ++released) {
      if (released == waited) wait_to(waited + 1);
      if (v.lane == 0) mbar_arrive(v.empty0 + 8 * rs);
      if (++rs == STAGES) { rs = 0; rph ^= 1u; }
    }
  };
  const uint4* g = reinterpret_cast<const uint4*>(gsrc);
  for (int r = 2 * v.warp; r < nrows; r += 2 * NCW) {
    const bool two = r + 1 < nrows;
    const uint32_t b0 = (uint32_t)r * rowb;
    if (!DIRECT) {
      release_to((int)(b0 / STAGE_BYTES));
      wait_to((int)((b0 + (two ? 2 : 1) * rowb - 1) / STAGE_BYTES) + 1);
    }
    const uint32_t la = (base + b0) % RING;      // row r's first piece in the ring
    float sa = 0.f, sa2 = 0.f, sb = 0.f, sb2 = 0.f;
    auto wpiece = [&](int row, int q) -> uint4 {   // piece q of row r + row
      if (DIRECT) return __ldcs(g + (long)(r + row) * np + q);
      return lds128_ring(ring0, la + (uint32_t)row * rowb + 16u * q);
    };
    int q = v.lane;
    for (; q + 32 < np; q += 64) {
      const uint4 wa = wpiece(0, q), wa2 = wpiece(0, q + 32);
      const uint4 wb = two ? wpiece(1, q) : make_uint4(0, 0, 0, 0), wb2 = two ? wpiece(1, q + 32) : make_uint4(0, 0, 0, 0);
      const float4 x0 = ldsf4(xs0 + 16u * q), x1 = ldsf4(xs0 + hb + 16u * q);
      const float4 y0 = ldsf4(xs0 + 16u * (q + 32)), y1 = ldsf4(xs0 + hb + 16u * (q + 32));
      sa += dot16x(wa, x0, x1);
      sa2 += dot16x(wa2, y0, y1);
      sb += dot16x(wb, x0, x1);
      sb2 += dot16x(wb2, y0, y1);
    }
    if (q < np) {
      const uint4 wa = wpiece(0, q), wb = two ? wpiece(1, q) : make_uint4(0, 0, 0, 0);
      const float4 x0 = ldsf4(xs0 + 16u * q), x1 = ldsf4(xs0 + hb + 16u * q);
      sa += dot16x(wa, x0, x1);
      sb += dot16x(wb, x0, x1);
    }
    float s2[2] = {sa + sa2, sb + sb2};
    int row;
    const float tot = warp_sum_rows<2>(s2, v.lane, row);
    if (v.lane == 0) acc[r] = tot;
    if (v.lane == 16 && two) acc[r + 1] = tot;
  }
  if (!DIRECT) release_to(total);
  consumer_sync();
  return make_int2(rs, (int)rph);
}

// Dispatch on the weight dtype of stream si (its buffer is the instruction's weight operand).
// The stream's byte offset already selects the tile's first row; `expert` selects the matrix of a
// stack [experts, rows, K] (a late-bound stream's run for that expert, which the loader opened), and
// xs_at where in xs the activation vector starts (several vectors loaded at once; the register
// path's row sums stay at the top of xs, so xs_at + K must stay below MAX_K - PART_FLOATS).
// What gemv reads of the tables for stream si of weight buffer w_buffer (the first row of matrix
// `expert` of a stack), resolved when the task begins: read after x has loaded, each table line that
// has left L1 is a memory round trip between x and the first weight stage (tagged.cuh: act_out). The
// packed formats' scales are read at the GEMV. (LINEAR_RESIDUAL resolves its source at the GEMV: held
// from its start, it made the NVFP4-cache build's main loop spill 48 bytes more.)
struct gemv_src {
  const unsigned char* base;                     // the stream's first row (the direct-loads path reads it)
  int si, w, expert, kp, dtype;
};
__device__ __forceinline__ gemv_src gemv_source(const mvm_ctx& c, int si, int w_buffer, int expert = 0) {
  return gemv_src{stream_base(c, si, w_buffer, expert), si, w_buffer, expert, gemv_kp(c, w_buffer),
                  (int)bufinfo(c, w_buffer).dtype};
}

// xmode 1: the task's last GEMV read the same x, at the same xs_at, from a weight of the same format and shape
// (the 4-bit tensor-core paths, gemv_f8.cuh and gemv_imma.cuh, reuse the B fragments it built); 2: the task is
// done with x after this GEMV, and acc is c.s.acc (gemv_imma.cuh's in-place form may write over both); 0: neither.
__device__ __forceinline__ void gemv(mvm_ctx& c, const gemv_src& g, int nrows, int K, float* acc, int xs_at = 0,
                                     int xmode = 0) {
  if (g.dtype == MVM_F8E4M3 || g.dtype == MVM_E2M1 || g.dtype == MVM_U4) {
    const mvm_buffer_t& info = bufinfo(c, g.w);
    const gemv_view v{c.s.ring[0], c.s.xs + xs_at, c.s.xs + (MEGAVM_MAX_K - PART_FLOATS), smem_addr(&c.s.full[0]),
                      smem_addr(&c.s.empty[0]), c.stage, c.phase, c.warp, c.lane, c.direct};
    const long m = info.ndim == 3 ? g.expert * info.shape[1] : 0;    // the matrix's first row in a stack
    const int2 rp = gemv_packed(v, g.base, nrows, K, g.kp, acc, info.scale >= 0 ? (const float*)buf(c, info.scale) : nullptr,
                                info.block_scale >= 0 ? (const unsigned char*)buf(c, info.block_scale) : nullptr, m,
                                (uint32_t)c.ins->streams[g.si].byte_offset,
                                g.dtype, xs_at == 0 && info.ndim == 2, xmode);
    c.stage = rp.x;
    c.phase = (uint32_t)rp.y;
  } else if (g.dtype == MVM_BF16) {
    gemv_stream<__nv_bfloat16>(c, reinterpret_cast<const __nv_bfloat16*>(g.base), nrows, K, g.kp, acc, xs_at);
  } else {
    gemv_stream<float>(c, reinterpret_cast<const float*>(g.base), nrows, K, g.kp, acc, xs_at);
  }
}
__device__ __forceinline__ void gemv(mvm_ctx& c, int si, int w_buffer, int nrows, int K, float* acc, int expert = 0,
                                     int xs_at = 0, int xmode = 0) {
  gemv(c, gemv_source(c, si, w_buffer, expert), nrows, K, acc, xs_at, xmode);
}

// Load x into xs, normalised when the instruction has a gamma (prefetched into xs before the wait).
// (its layout set by the dtype of the weights w_buf it will meet).
__device__ __forceinline__ float load_x_norm(mvm_ctx& c, int x_buf, bool normed, int K, float eps, int w_buf) {
  const float* x = (const float*)buf(c, x_buf);
  if (buf_tagged(c, x_buf)) return load_x_t<true>(c, x, x_buf, normed, K, eps, xs_split(c, w_buf));
  return load_x_t<false>(c, x, x_buf, normed, K, eps, xs_split(c, w_buf));
}
