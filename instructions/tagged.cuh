// Tagged hand-offs (docs/ir.md): an f32 activation stored as 8-byte words, the value's bits in the low
// half and in the high half the tag of the step that wrote it (its absolute step + 1; memory starts
// zeroed). A reader polls the words it needs until their tags are its step's, instead of waiting on
// its producers' counter and then loading: one L2 round trip instead of a release, a polled acquire
// and a load. Each word is written once a step, by one 8-byte store, which no reader sees in halves.
// Seeing a word orders the reader after that word only: the validator wants every untagged read
// ordered by counter waits (schedule/tagging.py). MVM_TAG_FENCE=1 (research, off) adds the fences
// that would make a polled wait order everything a counter wait does; they cost 100 us a step.
#pragma once
#include "device.cuh"

__device__ __forceinline__ bool buf_tagged(const mvm_ctx& c, int b) {
  return b >= 0 && (bufinfo(c, b).flags & MEGAVM_BUFFER_TAGGED);
}
__device__ __forceinline__ uint32_t step_tag(const mvm_ctx& c) { return c.epoch + 1u; }

// A thread's tagged stores come after this; its accesses before it (and, past a barrier, its block's)
// happen before every reader that sees one of those stores.
__device__ __forceinline__ void tag_release() {
  if (MVM_TAG_FENCE) asm volatile("fence.acq_rel.gpu;" ::: "memory");
}
// After a thread's polls: what the writers did before their stores happens before what follows.
__device__ __forceinline__ void tag_acquire() {
  if (MVM_TAG_FENCE) asm volatile("fence.acq_rel.gpu;" ::: "memory");
}

__device__ __forceinline__ void st_tagged(float* base, long i, float v, uint32_t tag) {
  uint64_t* p = reinterpret_cast<uint64_t*>(base) + i;
  asm volatile("st.relaxed.gpu.global.u64 [%0], %1;" ::"l"(p), "l"(((uint64_t)tag << 32) | __float_as_uint(v))
               : "memory");
}

__device__ __forceinline__ uint64_t ld_word(const uint64_t* p) {
  uint64_t v;
  asm volatile("ld.relaxed.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}

// Give up on a poll: on abort, or past the wait timeout (then a dump naming the buffer, the tag seen
// and the tag expected). Checked every 64 spins.
// (Out of line, with no reference to the context: that would put the context on the stack.)
__device__ __noinline__ bool poll_expired(const mvm_args_t& a, uint32_t block, uint32_t qpos, const mvm_instr_t* ins,
                                          unsigned long long t0, int b, uint32_t seen, uint32_t tag) {
  if (aborted(a)) return true;
  if (globaltimer() - t0 <= a.timeout_ns) return false;
  mvm_fail(a, MVM_ERR_TAG_TIMEOUT, block, qpos, ins, b, seen, tag);
  return true;
}

// Element i of tagged buffer b (at base), once its word carries tag (the context in parts: an
// out-of-line caller has no mvm_ctx).
__device__ __forceinline__ float poll_value(const mvm_args_t& a, uint32_t block, uint32_t qpos, const mvm_instr_t* ins,
                                            int b, const float* base, long i, uint32_t tag) {
  const uint64_t* p = reinterpret_cast<const uint64_t*>(base) + i;
  uint64_t v = ld_word(p);
  if ((uint32_t)(v >> 32) != tag) {
    const unsigned long long t0 = globaltimer();
    for (uint32_t spin = 1; (uint32_t)(v >> 32) != tag; ++spin) {
      if (MVM_TAG_SLEEP) __nanosleep(MVM_TAG_SLEEP);
      v = ld_word(p);
      if ((spin & 63) == 0 && poll_expired(a, block, qpos, ins, t0, b, (uint32_t)(v >> 32), tag)) break;
    }
  }
  return __uint_as_float((uint32_t)v);
}

// Element i of tagged buffer b from its word v, loaded ahead: at once when v carries tag, else polled until
// the word does. Loading several words before settling the first keeps their round trips in flight
// together (a loop of poll_value waits for each load before it issues the next).
// (The poll out of line: inlined at every settle, its loop made the main loop spill.)
__device__ __noinline__ float poll_late(const mvm_args_t& a, uint32_t block, uint32_t qpos, const mvm_instr_t* ins,
                                        int b, const float* base, long i, uint32_t tag) {
  return poll_value(a, block, qpos, ins, b, base, i, tag);
}
__device__ __forceinline__ float settle(const mvm_args_t& a, uint32_t block, uint32_t qpos, const mvm_instr_t* ins,
                                        int b, const float* base, long i, uint32_t tag, uint64_t v) {
  return (uint32_t)(v >> 32) == tag ? __uint_as_float((uint32_t)v) : poll_late(a, block, qpos, ins, b, base, i, tag);
}

// Element i of f32 activation b at base (tagged: its word, once its writer's store has landed).
__device__ __forceinline__ float act_at(mvm_ctx& c, int b, const float* base, bool tagged, long i) {
  if (!tagged) return __ldcg(base + i);
  return poll_value(c.a, c.block, c.qpos, c.ins, b, base, i, step_tag(c));
}
__device__ __forceinline__ float act_at(mvm_ctx& c, int b, long i) {
  return act_at(c, b, (const float*)buf(c, b), buf_tagged(c, b), i);
}
// Element i of f32 activation b at base as act_at, from what act_word loaded ahead.
__device__ __forceinline__ uint64_t act_word(const float* base, bool tagged, long i) {
  return tagged ? ld_word(reinterpret_cast<const uint64_t*>(base) + i) : (uint64_t)__float_as_uint(__ldcg(base + i));
}
__device__ __forceinline__ float act_settle(mvm_ctx& c, int b, const float* base, bool tagged, long i, uint64_t v) {
  return tagged ? settle(c.a, c.block, c.qpos, c.ins, b, base, i, step_tag(c), v) : __uint_as_float((uint32_t)v);
}

__device__ __forceinline__ void ld_words2(const uint64_t* p, uint64_t& a, uint64_t& b) {
  asm volatile("ld.relaxed.gpu.global.v2.u64 {%0, %1}, [%2];" : "=l"(a), "=l"(b) : "l"(p) : "memory");
}
__device__ __forceinline__ bool tags_are(uint64_t a, uint64_t b, uint64_t d, uint64_t e, uint32_t tag) {
  return ((uint32_t)(a >> 32) == tag) & ((uint32_t)(b >> 32) == tag) & ((uint32_t)(d >> 32) == tag) &
         ((uint32_t)(e >> 32) == tag);
}

// The tag a timeout dump names for four words: the first that is not tag (tag when all are).
__device__ __forceinline__ uint32_t stale_tag(uint64_t a, uint64_t b, uint64_t d, uint64_t e, uint32_t tag) {
  const uint32_t t[4] = {(uint32_t)(a >> 32), (uint32_t)(b >> 32), (uint32_t)(d >> 32), (uint32_t)(e >> 32)};
  return t[0] != tag ? t[0] : t[1] != tag ? t[1] : t[2] != tag ? t[2] : t[3];
}

// Four words' values, each the low half of its word.
__device__ __forceinline__ float4 word_values(uint64_t w0, uint64_t w1, uint64_t w2, uint64_t w3) {
  return make_float4(__uint_as_float((uint32_t)w0), __uint_as_float((uint32_t)w1), __uint_as_float((uint32_t)w2),
                     __uint_as_float((uint32_t)w3));
}

// Elements i..i+3 of tagged buffer b: two 16-byte loads of two words each (each word whole), again
// until all four carry this step's tag.
__device__ __forceinline__ float4 act4_tagged(mvm_ctx& c, int b, const uint64_t* x, long i) {
  const uint32_t tag = step_tag(c);
  uint64_t w0, w1, w2, w3;
  ld_words2(x + i, w0, w1);
  ld_words2(x + i + 2, w2, w3);
  if (!tags_are(w0, w1, w2, w3, tag)) {
    const unsigned long long t0 = globaltimer();
    for (uint32_t spin = 1; !tags_are(w0, w1, w2, w3, tag); ++spin) {
      if (MVM_TAG_SLEEP) __nanosleep(MVM_TAG_SLEEP);
      ld_words2(x + i, w0, w1);
      ld_words2(x + i + 2, w2, w3);
      if ((spin & 63) == 0 && poll_expired(c.a, c.block, c.qpos, c.ins, t0, b, (uint32_t)(w0 >> 32), tag)) break;
    }
  }
  return word_values(w0, w1, w2, w3);
}

// The out-of-line polls' loop: load(w0, w1, w2, w3) again until all four carry tag, or the poll expires.
template <typename Load>
__device__ __forceinline__ float4 poll4_loop(const mvm_args_t& a, uint32_t block, uint32_t qpos, const mvm_instr_t* ins,
                                             int b, uint32_t tag, Load load) {
  uint64_t w0, w1, w2, w3;
  const unsigned long long t0 = globaltimer();
  for (uint32_t spin = 1;; ++spin) {
    load(w0, w1, w2, w3);
    if (tags_are(w0, w1, w2, w3, tag)) break;
    if (MVM_TAG_SLEEP) __nanosleep(MVM_TAG_SLEEP);
    if ((spin & 63) == 0 && poll_expired(a, block, qpos, ins, t0, b, stale_tag(w0, w1, w2, w3, tag), tag)) break;
  }
  return word_values(w0, w1, w2, w3);
}

// act4_tagged's poll, out of line (poll_late's form for four words): for loops that load a group and settle
// it at once, where the inlined poll loop made the main loop spill (EXPERT_DOWN's h).
__device__ __noinline__ float4 poll4_late(const mvm_args_t& a, uint32_t block, uint32_t qpos, const mvm_instr_t* ins,
                                          int b, const uint64_t* x, long i, uint32_t tag) {
  return poll4_loop(a, block, qpos, ins, b, tag, [x, i](uint64_t& w0, uint64_t& w1, uint64_t& w2, uint64_t& w3) {
    ld_words2(x + i, w0, w1);
    ld_words2(x + i + 2, w2, w3);
  });
}
// Elements i, i + s, i + 2 s and i + 3 s of tagged buffer b (the first n of them; the rest 0), loaded together
// and again together until each carries tag: one round trip once they have all landed. (Loaded ahead and
// settled one at a time, every word not yet landed at the first load took a round trip of its own.)
// Out of line, as poll4_late.
__device__ __noinline__ float4 poll4_strided(const mvm_args_t& a, uint32_t block, uint32_t qpos, const mvm_instr_t* ins,
                                             int b, const uint64_t* x, long i, long s, int n, uint32_t tag) {
  const uint64_t none = (uint64_t)tag << 32;     // the words past n: 0.f, and already of the step
  return poll4_loop(a, block, qpos, ins, b, tag, [=](uint64_t& w0, uint64_t& w1, uint64_t& w2, uint64_t& w3) {
    w0 = n > 0 ? ld_word(x + i) : none;
    w1 = n > 1 ? ld_word(x + i + s) : none;
    w2 = n > 2 ? ld_word(x + i + 2 * s) : none;
    w3 = n > 3 ? ld_word(x + i + 3 * s) : none;
  });
}
// Elements i..i+3 of tagged buffer b as act4_tagged, from words w0..w3 loaded ahead (ld_words2).
__device__ __forceinline__ float4 act4_settle(mvm_ctx& c, int b, const uint64_t* x, long i, uint64_t w0, uint64_t w1,
                                              uint64_t w2, uint64_t w3) {
  if (!tags_are(w0, w1, w2, w3, step_tag(c))) return poll4_late(c.a, c.block, c.qpos, c.ins, b, x, i, step_tag(c));
  return word_values(w0, w1, w2, w3);
}

// y[i] = v into f32 activation y (tagged or plain); tagged stores after tag_release().
__device__ __forceinline__ void act_store(float* y, bool tagged, long i, float v, uint32_t tag) {
  if (tagged)
    st_tagged(y, i, v, tag);
  else
    y[i] = v;
}

// An output activation's address and form, read from the tables when its task begins: read after the
// task's GEMV they cost a memory round trip on the chain (its tables have left L1 by then: 0.3-0.4 us an
// o or q tile on an H100, docs/performance.md, session 43).
struct act_out {
  float* p;
  bool tagged;
};
__device__ __forceinline__ act_out out_of(const mvm_ctx& c, int b) {   // b < 0: none
  return b < 0 ? act_out{nullptr, false} : act_out{(float*)buf(c, b), buf_tagged(c, b)};
}
