// int4 (AWQ) rows on the integer tensor cores (build knob MVM_U4_IMMA: the fewest tile rows it takes, 32 by
// default; 0: off): tiles of a 2-D U4 weight of K = 2048 or 4096 whose B fragments fit in xs above x.
// gemv_packed calls it where u4_imma_form says so, before gemv_xreg (and MVM_U4_IMMA_LONG's rows, 32 by default,
// of K past 4096 with B in x's place). mma.sync.m16n8k32 on u8 x s8 is native on sm_80 and sm_90 (IMMA.16832),
// and its sums are exact (bench/probes/int4_imma_gemv.cu: 665-784 cycles a
// 16 KiB stage of codes on one H200 SM, against 1650-2150 for the row-per-warp loop's NVFP4 and 1688 for
// gemv_xreg's).
#pragma once
#include "gemv_core.cuh"

// How it computes a row's sum, (code - zero) x scale a group of 128 against x:
// - A: a word of 8 codes is two registers of bytes 0..15 (its even and its odd codes) after one shift and two
//   ANDs. Lane (g, t) brings rows g and g + 8 of a group of 16 rows; for each group of 128 codes of its warp's
//   range it loads 16 bytes of each row (words 4 t .. 4 t + 3 of the 16) and gives word 4 t + j to mma j: the
//   four mmas of a group meet each of its codes once.
// - B: warp w owns codes [w K/8, (w + 1) K/8) of every row. Per group of 128, x over a power of two sx (the
//   group's largest |x| / sx in [32, 64)) is four s8 parts: q0 = rint(x / sx), each next part what the last
//   left times 128, rounded (all within +-64). Column p < 4 of B holds part p, columns 4..7 zero. A group's
//   four mmas accumulate in s32, exactly (at most 128 x 15 x 64), in two chains (mmas j even and j odd) added
//   after; two groups of 128 a trip.
// - Per group and row, in f32: scale x (sx x (the parts' sums times 128^-p) - zero x the group's f32 sum of
//   x). Lane t = 0 holds parts 0 and 1 of rows g and g + 8, lane t = 1 parts 2 and 3, the others zeros (B's
//   zero columns), which they add without a branch. The (scale, zero) pairs come through a per-warp cp.async
//   ring in xs (MVM_U4_TAB_AHEAD groups of 16 rows ahead; below).
// - The sums: a quad's four lanes by shuffles, the warps' in warp order at the end (bitwise reproducible,
//   direct loads the same bits). Not gemv_core's or gemv_xreg's order: they agree to f32's rounding.
#if MVM_U4_IMMA || MVM_U4_IMMA_LONG
#define MVM_IF_U4_IMMA(...) __VA_ARGS__
// Per-warp row sums of the in-place form, in acc (2 ACC_ROWS floats): a warp's 64 rows
constexpr int IMMA_SUM_ROWS = 2 * ACC_ROWS / NCW;
// Which form takes the tile (0: neither). xmode: gemv's (1: the task's last GEMV built B on the same x; 2: the
// task is done with x after this GEMV, and acc holds 2 ACC_ROWS floats).
// 1: tiles of at least MVM_U4_IMMA rows of K = 2048 or 4096 (a group of 16 rows is one or two whole ring stages)
//    whose B fragments (K floats) and each group's sx and sum of x (K / 64 floats) fit between x and the
//    per-warp sums: 2 K + K / 64 + PART_FLOATS floats of xs, which a build sized to its program holds for them
//    when the knob's default is on (instructions/tiles.py, tc_shared).
// 2: tiles of MVM_U4_IMMA_LONG to IMMA_SUM_ROWS rows of K a multiple of 2048 past 4096 (a group of 16 rows is
//    K / 2048 whole stages, all in the ring at once) when x dies with the GEMV: each warp writes B's fragments
//    of its range over its range's x, group by group, the tables above x (K + K / 64 floats of xs), and its
//    row sums into acc.
// The group tables' ring (MVM_U4_TAB_AHEAD > 0, form 1): MVM_U4_TAB_AHEAD + 1 slots a warp, each its slice of
// a group of 16 rows (row r's K / 1024 (scale, zero) pairs of the warp's range: K / 256 bytes), above the group
// sums; filled MVM_U4_TAB_AHEAD groups ahead by cp.async, so that a pair is a shared-memory load (from L2 it
// was one round trip a group of 128 codes, longer than the mmas it fed).
constexpr int U4_TAB_SLOTS = MVM_U4_TAB_AHEAD + 1;
// Floats of xs the ring takes at K (the eight warps' slots; instructions/tiles.py: u4_tab_ring).
__device__ __forceinline__ constexpr int u4_tab_floats(int K) { return MVM_U4_TAB_AHEAD ? U4_TAB_SLOTS * K / 8 : 0; }
// This warp's slice of group gi's tables into its ring slot, as one cp.async group (empty past the tile's
// groups): lane l < 16 copies row 16 gi + l's (the tile's last row past it).
__device__ __forceinline__ void u4_tabs_async(const gemv_view& v, unsigned char* ring, const unsigned char* tb, int gi,
                                              int nrows, int K) {
  const int wb = K / 256;                        // bytes of a row's slice
  if (v.lane < 16 && 16 * gi < nrows) {
    const int r = min(16 * gi + v.lane, nrows - 1);
    unsigned char* dst = ring + (gi % U4_TAB_SLOTS) * 16 * wb + v.lane * wb;
    const unsigned char* src = tb + (long)r * (K / 32) + wb * v.warp;
    if (wb == 16) cp_async16(dst, src);
    else cp_async8(dst, src);
  }
  asm volatile("cp.async.commit_group;" ::: "memory");
}
__device__ __forceinline__ int u4_imma_form(const gemv_view& v, int nrows, int K, int xmode) {
  if (NCW != 8 || STAGE_BYTES != 16384) return 0;
  if (MVM_U4_IMMA && (K == 2048 || K == 4096) && nrows >= MVM_U4_IMMA && nrows <= ACC_ROWS &&
      v.xs + 2 * K + K / 64 + u4_tab_floats(K) <= v.part)
    return 1;
  if (MVM_U4_IMMA_LONG && xmode == 2 && K > 4096 && K % 2048 == 0 && K / 2048 <= STAGES &&
      nrows >= MVM_U4_IMMA_LONG && nrows <= IMMA_SUM_ROWS && v.xs + K + K / 64 <= v.part + PART_FLOATS)
    return 2;
  return 0;
}
__device__ __forceinline__ void mma_u8s8_16832(int (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                               uint32_t b0, uint32_t b1) {
  asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
               "{%0, %1, %2, %3};"
               : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
               : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// B's fragments of warp w's range into frag (128 bytes an mma: the two words of lanes g < 4, slot 4 g + t), and
// each of its groups' sx and f32 sum of x into gx (2 floats a group, the warp's K / 1024 groups). Mma j of group
// q: lane (g, t)'s first word holds part g of codes 8 (4 t + j) + 2 i (i = 0..3), its second the odd codes
// after them. Lane l of the warp builds item (j, t, h) = l of each group: its four codes' four parts at once.
// In place (frag null): group q's x is 16 floats in each of xs's eight runs (xs_split 3), and mma j's 32 words
// go to runs 2 j and 2 j + 1 (words 0..15, 16..31, rotated as below), once every lane has read the group.
__device__ __forceinline__ void u4_imma_fragments(const gemv_view& v, int K, uint32_t* frag, float* gx) {
  const int k0 = (K / NCW) * v.warp, hb = K / 8, G = K / 1024;
  const uint32_t xs0 = smem_addr(v.xs);
  // x[k] in xs_split 3 (gemv_core.cuh: xs_index, with the run length hb held in a register)
  auto xat = [&](int k) { return ldsf32(xs0 + 4u * (((k >> 2) & 7) * hb + ((k >> 5) << 2) + (k & 3))); };
  const int j = v.lane >> 3, t = (v.lane >> 1) & 3, h = v.lane & 1;
  // Load i of a group reads code 8 (4 t + j) + 2 (i ^ (j & 1)) + h: 16 positions of two runs (a 2-way bank
  // conflict, the least: a group's x lies on 16 banks), each of the group's codes once; its sx and sum come from
  // the same values. Word p of mma j is stored rotated by 8 j words within the mma's 32 (frag) or by 8 j within
  // its 16 of a run (in place), so that the warp's 32 stores of a part hit 32 banks (16, in place).
  const int jr = j & 1;
  // two groups at a time (G is even), their chains side by side: the build is on the task's critical path
#pragma unroll 1
  for (int q2 = 0; q2 < G; q2 += 2) {
    float mx[2] = {0.f, 0.f}, sum[2] = {0.f, 0.f}, xv[2][4];
#pragma unroll
    for (int u = 0; u < 2; ++u) {
      const int kq = k0 + 128 * (q2 + u);
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        xv[u][i] = xat(kq + 8 * (4 * t + j) + 2 * (i ^ jr) + h);
        mx[u] = fmaxf(mx[u], fabsf(xv[u][i]));
        sum[u] += xv[u][i];
      }
    }
#pragma unroll
    for (int o = 16; o; o >>= 1)
#pragma unroll
      for (int u = 0; u < 2; ++u) {
        mx[u] = fmaxf(mx[u], __shfl_xor_sync(0xffffffffu, mx[u], o));
        sum[u] += __shfl_xor_sync(0xffffffffu, sum[u], o);
      }
    if (frag == nullptr) __syncwarp();           // in place: both groups' x read by every lane before it is written over
#pragma unroll
    for (int u = 0; u < 2; ++u) {
      const int q = q2 + u, kq = k0 + 128 * q;
      // sx = 2^ex, the largest |x| / sx in [32, 64); 0, inf and NaN: sx 1 (inf and NaN do not survive: the
      // knob's limit); subnormal largest values clamp to 2^-125
      const int ex = mx[u] > 0.f && mx[u] <= 3.0e38f ? max(-120, ((__float_as_int(mx[u]) >> 23) & 0xff) - 127) - 5 : 0;
      const float down = __int_as_float((127 - ex) << 23);
      uint32_t w[4] = {0u, 0u, 0u, 0u};
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        float r = xv[u][i] * down;
#pragma unroll
        for (int p = 0; p < 4; ++p) {
          const float c = rintf(r);
          w[p] |= ((uint32_t)(int)c & 0xffu) << (8 * (i ^ jr));
          r = (r - c) * 128.f;
        }
      }
      if (frag != nullptr) {
        uint32_t* fq = frag + (v.warp * G + q) * 4 * 32 + j * 32;
#pragma unroll
        for (int p = 0; p < 4; ++p) fq[(2 * (4 * p + t) + h + 8 * j) & 31] = w[p];
      } else {
        uint32_t* fq = reinterpret_cast<uint32_t*>(v.xs) + kq / 8;
#pragma unroll
        for (int p = 0; p < 4; ++p) {
          const int wi = 2 * (4 * p + t) + h;
          fq[(2 * j + (wi >> 4)) * hb + ((wi + 8 * j) & 15)] = w[p];
        }
      }
      if (v.lane == 0) { gx[2 * (v.warp * G + q)] = __int_as_float((127 + ex) << 23); gx[2 * (v.warp * G + q) + 1] = sum[u]; }
    }
  }
  __syncwarp();
}

// acc[r] = row r . x (int4 has no row scales; the call is gemv_packed's last). gsrc: the stream's first byte
// (direct loads); tb: the tile's group table, row r's (scale, zero) f16 pairs at tb + r K/32 bytes. same_x: the
// task's last GEMV took this path on the same x (RMS_GLU's up after gate), so B, sx and the sums are still in
// xs. A group of 16 rows is K / 2048 ring stages, waited for together and handed back together. Rows past the
// tile's are read through the ring too (what the ring holds there) and their sums dropped; direct loads read the
// tile's last row in their place.
// INPLACE: u4_imma_form's form 2 (B in x's place, the row sums in acc), a loop of its own: with the form a
// runtime choice, form 1's loop carried form 2's address selects (llama-7b-32k int4's RMS_GLU tasks took 28.3 us
// on a build with MVM_U4_IMMA_LONG=1, against 25.6).
template <bool DIRECT, bool INPLACE>
__device__ __forceinline__ int2 gemv_u4_imma_t(gemv_view v, const unsigned char* gsrc, int nrows, int K, float* acc,
                                               const unsigned char* tb, bool same_x) {
  const int G = K / 2048, Q = K / 1024;          // ring stages a group of 16 rows; groups of 128 a warp
  constexpr bool inplace = INPLACE;
  uint32_t* frag = inplace ? nullptr : reinterpret_cast<uint32_t*>(v.xs + K);
  float* const gx = v.xs + (inplace ? K : 2 * K);
  constexpr bool TRING = MVM_U4_TAB_AHEAD > 0 && !MVM_PROBE_U4_NOTAB;
  const bool tring = TRING && !inplace;
  unsigned char* const tring0 = reinterpret_cast<unsigned char*>(gx + K / 64) + v.warp * U4_TAB_SLOTS * (K / 16);
  if (tring)
    for (int gi = 0; gi < MVM_U4_TAB_AHEAD; ++gi) u4_tabs_async(v, tring0, tb, gi, nrows, K);   // under the build
  if (!same_x) u4_imma_fragments(v, K, frag, gx);   // each warp its own range's, read by itself alone
  const int g = v.lane >> 2, t = v.lane & 3, rowb = K / 2, k0 = (K / NCW) * v.warp;
  const uint32_t msk = v.lane < 16 ? 0xffffffffu : 0u;
  // mma j of group q: B's two words at fj[j] + q qs (each mma's words rotated by 8 j: u4_imma_fragments)
  const uint32_t f0 = inplace ? smem_addr(v.xs) + (K / 2) * ((v.lane >> 3) & 1) + k0 / 2
                              : smem_addr(frag) + (v.warp * Q) * 512;
  const uint32_t qs = inplace ? 64u : 512u, js = inplace ? (uint32_t)K : 128u;
  uint32_t fj[4];
#pragma unroll
  for (int j = 0; j < 4; ++j)
    fj[j] = f0 + js * j + 8 * (inplace ? ((v.lane & 7) + 4 * j) & 7 : ((v.lane & 15) + 4 * j) & 15);
  float* const part = inplace ? acc + v.warp * IMMA_SUM_ROWS : v.part + v.warp * ACC_ROWS;
  const uint32_t ring0 = smem_addr(v.ring);
  const uint32_t gx0 = smem_addr(gx) + 8u * (v.warp * Q);   // this warp's groups' (sx, sum of x)
  const __half2* const tab = reinterpret_cast<const __half2*>(tb) + k0 / 128;
  const int ngroups = (nrows + 15) / 16, nst = (nrows * rowb + STAGE_BYTES - 1) / STAGE_BYTES;
  for (int gi = 0; gi < ngroups; ++gi) {
    if (tring) u4_tabs_async(v, tring0, tb, gi + MVM_U4_TAB_AHEAD, nrows, K);   // into the slot group gi - 1 used
    const int r0 = 16 * gi, ns = min(G, nst - G * gi);
    const int ra = min(r0 + g, nrows - 1), rb8 = min(r0 + g + 8, nrows - 1);   // the table's rows (clamped)
    uint32_t pa, pb;
    if constexpr (DIRECT) {
      pa = 0; pb = 0;
    } else {
      if (inplace) {
        // offsets from the ring's start, wrapped at its end when read: a row of K = 14336 straddles stages
        pa = (v.stage % STAGES) * STAGE_BYTES + g * rowb + k0 / 2 + 16 * t;
        pb = pa + 8 * rowb;
      } else {
        // K <= 4096: rows g and g + 8 lie whole in one stage each (the group's first and, at K = 4096, its
        // second): their shared addresses, wrapped once here
        const int ob = 8 * rowb;
        pa = ring0 + (v.stage % STAGES) * STAGE_BYTES + g * rowb + k0 / 2 + 16 * t;
        pb = ring0 + ((v.stage + ob / STAGE_BYTES) % STAGES) * STAGE_BYTES + ob % STAGE_BYTES + g * rowb + k0 / 2 + 16 * t;
      }
      for (int i = 0; i < ns; ++i) {
        const int s = v.stage + i;
        while (!mbar_try_wait(v.full0 + 8 * (s % STAGES), v.phase ^ (s >= STAGES ? 1u : 0u))) {}
      }
    }
    const uint4* ga = reinterpret_cast<const uint4*>(gsrc + (long)ra * rowb + k0 / 2) + t;
    const uint4* gb = reinterpret_cast<const uint4*>(gsrc + (long)rb8 * rowb + k0 / 2) + t;
    const __half2* ta = tab + (long)ra * (K / 128);
    const __half2* tbb = tab + (long)rb8 * (K / 128);
    float ag = 0.f, ah = 0.f;
    // rows g and g + 8 of the group in its ring slot (K / 256 bytes a row), once its copies have landed
    const uint32_t sta = smem_addr(tring0) + (gi % U4_TAB_SLOTS) * 16 * (K / 256) + g * (K / 256), stb = sta + 8 * (K / 256);
    if (tring) {
      asm volatile("cp.async.wait_group %0;" ::"n"(MVM_U4_TAB_AHEAD) : "memory");   // group gi's have landed
      __syncwarp();
    }
    auto pair = [&](const __half2* p, uint32_t sp, int q) {
      if (MVM_PROBE_U4_NOTAB) return __floats2half2_rn(1.f, 8.f);
      if (!tring) return __ldg(p + q);
      const uint32_t u = lds32(sp + 4u * q);
      return *reinterpret_cast<const __half2*>(&u);
    };
    // Two groups of 128 a trip (Q is even), their eight mmas in four independent chains (each group's mmas
    // j even and j odd apart, added after: s32 sums are exact, so the bits are the one-chain loop's). One chain
    // of four a group left a warp waiting on the tensor core's latency, about 500 cycles a group of 128
    // (clock64 in the kernel; llama-7b-32k int4's RMS_GLU tasks took 31.4 us with it, 28.0 with this).
    __half2 s0a = pair(ta, sta, 0), s0b = pair(tbb, stb, 0), s1a = pair(ta, sta, 1), s1b = pair(tbb, stb, 1);
#pragma unroll 1
    for (int q = 0; q < Q; q += 2) {
      const bool more = q + 2 < Q;               // the next trip's table pairs, loaded ahead
      const __half2 n0a = more ? pair(ta, sta, q + 2) : s0a, n0b = more ? pair(tbb, stb, q + 2) : s0b;
      const __half2 n1a = more ? pair(ta, sta, q + 3) : s1a, n1b = more ? pair(tbb, stb, q + 3) : s1b;
      uint4 wa[2], wb[2];
#pragma unroll
      for (int u = 0; u < 2; ++u) {
        if constexpr (DIRECT) {
          wa[u] = __ldcs(ga + 4 * (q + u));
          wb[u] = __ldcs(gb + 4 * (q + u));
        } else if (inplace) {
          wa[u] = lds128_ring(ring0, pa + 64 * (q + u));
          wb[u] = lds128_ring(ring0, pb + 64 * (q + u));
        } else {
          wa[u] = lds128(pa + 64 * (q + u));
          wb[u] = lds128(pb + 64 * (q + u));
        }
      }
      uint32_t bf[2][4][2];
#pragma unroll
      for (int u = 0; u < 2; ++u)
#pragma unroll
        for (int j = 0; j < 4; ++j)
          asm volatile("ld.shared.v2.u32 {%0, %1}, [%2];" : "=r"(bf[u][j][0]), "=r"(bf[u][j][1])
                       : "r"(fj[j] + (q + u) * qs));
      int d[2][2][4] = {};                       // [group][j & 1][the mma's four sums]
#pragma unroll
      for (int j = 0; j < 4; ++j)
#pragma unroll
        for (int u = 0; u < 2; ++u) {
          const uint4& A = wa[u];
          const uint4& B = wb[u];
          const uint32_t ca = j == 0 ? A.x : j == 1 ? A.y : j == 2 ? A.z : A.w;
          const uint32_t cb = j == 0 ? B.x : j == 1 ? B.y : j == 2 ? B.z : B.w;
          mma_u8s8_16832(d[u][j & 1], ca & 0x0f0f0f0fu, cb & 0x0f0f0f0fu, (ca >> 4) & 0x0f0f0f0fu,
                         (cb >> 4) & 0x0f0f0f0fu, bf[u][j][0] & msk, bf[u][j][1] & msk);
        }
      // lane 0: parts 0, 1 and the zero point's term; lane 1: parts 2, 3; lanes t >= 2 hold B's zero columns
      // 4..7, so their sums are 0 and their terms add exactly nothing: no branch around them
      const float pw = t == 0 ? 1.f : 1.f / 16384.f;
#pragma unroll
      for (int u = 0; u < 2; ++u) {
        const uint32_t gq = gx0 + 8u * (q + u);
        const float sx = ldsf32(gq), zg = ldsf32(gq + 4u), zs = t == 0 ? zg : 0.f;
        const float2 fa = __half22float2(u ? s1a : s0a), fb = __half22float2(u ? s1b : s0b);
        const int d0 = d[u][0][0] + d[u][1][0], d1 = d[u][0][1] + d[u][1][1];
        const int d2 = d[u][0][2] + d[u][1][2], d3 = d[u][0][3] + d[u][1][3];
        ag = fmaf(fa.x, fmaf(sx, fmaf((float)d1, 1.f / 128.f, (float)d0) * pw, -fa.y * zs), ag);
        ah = fmaf(fb.x, fmaf(sx, fmaf((float)d3, 1.f / 128.f, (float)d2) * pw, -fb.y * zs), ah);
      }
      s0a = n0a; s0b = n0b; s1a = n1a; s1b = n1b;
    }
    ag += __shfl_xor_sync(0xffffffffu, ag, 1); ag += __shfl_xor_sync(0xffffffffu, ag, 2);
    ah += __shfl_xor_sync(0xffffffffu, ah, 1); ah += __shfl_xor_sync(0xffffffffu, ah, 2);
    if (t == 0) {
      if (r0 + g < nrows) part[r0 + g] = ag;
      if (r0 + g + 8 < nrows) part[r0 + g + 8] = ah;
    }
    if constexpr (!DIRECT)
      for (int i = 0; i < ns; ++i) release_stage(v);
  }
  consumer_sync();
  if (inplace) {                                 // row r's sums at acc[w 64 + r]: warp 0's is acc[r], read first
    const int r = v.warp * 32 + v.lane;          // (nrows <= 64 < NCT: a row a thread)
    if (r < nrows) {
      float a = acc[r];
#pragma unroll
      for (int w = 1; w < NCW; ++w) a += acc[w * IMMA_SUM_ROWS + r];
      acc[r] = a;
    }
  } else {
    for (int r = v.warp * 32 + v.lane; r < nrows; r += NCT) acc[r] = warp_order_sum(v, r);
  }
  consumer_sync();
  return make_int2(v.stage, (int)v.phase);
}
__device__ __noinline__ int2 gemv_u4_imma(gemv_view v, const unsigned char* gsrc, int nrows, int K, float* acc,
                                          const unsigned char* tb, bool same_x, int form) {
  if (MVM_U4_IMMA_LONG && form == 2)             // a build without the knob has form 1 alone
    return v.direct ? gemv_u4_imma_t<true, true>(v, gsrc, nrows, K, acc, tb, same_x)
                    : gemv_u4_imma_t<false, true>(v, gsrc, nrows, K, acc, tb, same_x);
  return v.direct ? gemv_u4_imma_t<true, false>(v, gsrc, nrows, K, acc, tb, same_x)
                  : gemv_u4_imma_t<false, false>(v, gsrc, nrows, K, acc, tb, same_x);
}
#else
#define MVM_IF_U4_IMMA(...)
#endif
