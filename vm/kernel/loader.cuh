// The loader warp: it streams the weights of its block's queue into the shared-memory ring that the
// opcodes' GEMVs consume (instructions/gemv.cuh), ahead of their waits.
#pragma once
#if MVM_PROBE_LOADER
#include <cstdio>
#endif
#include "../../instructions/device.cuh"
#include "counters.cuh"

// A walk over the weight bytes of this block's queue (every stream of every instruction, the queue
// once per step), in pieces of at most max_bytes. The current stream's address and length stay in
// registers, so a piece inside a stream costs no table reads. A late-bound stream is one run per
// expert id: the walk waits on the instruction's wait that covers the ids' writers (this step's
// threshold), then opens the runs in id order. A history stream (attention's K/V rows before this
// step's position) waits on the wait that covers the rows' writers one step back (rows written by
// earlier launches need none), then walks the rows this step sees, in pieces of whole rows. next() is
// false at the end, on abort, and on an id outside the stack (the launch fails with a dump naming it).
struct weight_walk {
  uint32_t step, qi;
  int si;                                        // the stream after the current one
  const unsigned char* src;                      // the current run's next byte
  uint64_t left;                                 // its bytes not yet walked
  int run, runs;                                 // a late-bound stream's next run, and its runs
  bool in_late;                                  // the current piece is of a late-bound run
  int32_t ids[MEGAVM_MAX_TOPK];                  // the late-bound stream's expert ids
  uint32_t piece;                                // the current stream's largest piece
  // the late-bound stream's stack, read once when it opens (a run's opening reads no table): its first
  // expert's bytes at the stream's offset, the bytes from one expert to the next and a run's, the experts
  const unsigned char* stack;
  uint64_t stride, run_bytes;
  int experts;
  // the ids held (their address, and 64 x step + count; count <= 32), so that the streams of one step that
  // read the same ids (an expert's gate and up rows) load them once; and the counter and target that a
  // wait of this walk last saw reached (counters only grow within a launch)
  const int32_t* held_ids;
  uint32_t held_tag;
  int seen_counter;
  uint32_t seen_target;
  // what counter w reaches in the launch's step e
  __device__ static uint32_t target_of(const mvm_args_t& a, const mvm_wait_t& w, uint32_t e) {
    return w.threshold + e * a.producers[w.counter];
  }
  // spin (backing off) until counter w reaches target; false on abort
  __device__ static bool wait_until(const mvm_args_t& a, const mvm_wait_t& w, uint32_t target) {
    uint32_t sleep = 64;
    for (uint32_t spin = 0; (int32_t)(ld_acquire(a.counters + w.counter) - target) < 0; ++spin) {
      __nanosleep(sleep);
      sleep = sleep < MVM_LATE_SLEEP_MAX ? 2 * sleep : sleep;
      if ((spin & 63) == 63 && aborted(a)) return false;
    }
    return true;
  }
  __device__ bool open_history(const mvm_args_t& a, const mvm_instr_t* ins, const mvm_stream_t& st, uint32_t max_bytes) {
    left = 0;
    if (a.flags & MVM_FLAG_NO_ATTN_HISTORY) return true;
    const mvm_buffer_t& b = a.buffers[st.buffer];
    const uint64_t rb = elems_bytes(b.dtype, (uint64_t)b.shape[2]);
    const long cap = b.shape[1];
    const long row0 = (long)(st.byte_offset / rb), k0 = row0 % cap, k1 = k0 + (long)(st.byte_count / rb);
    const long pos = (long)a.pos + step, window = st.index_first | st.index_count << 8;
    const long lo = window > 0 && pos - window + 1 > k0 ? pos - window + 1 : k0, hi = pos < k1 ? pos : k1;
    if (hi <= lo) return true;
    // rows before pos: the step before wrote the last of them (earlier launches are complete)
    const mvm_wait_t& w = ins->waits[st.index_wait];
    if (step > 0 && !wait_until(a, w, target_of(a, w, a.epoch + step - 1))) return false;
    fence_proxy_async();                         // those writes before this copy's reads
    src = (const unsigned char*)a.ptrs[st.buffer] + (uint64_t)(row0 + lo - k0) * rb;
    left = (uint64_t)(hi - lo) * rb;
    piece = (uint32_t)(max_bytes / rb * rb);
    return true;
  }
  __device__ bool open_late(const mvm_args_t& a, const mvm_instr_t* ins, const mvm_stream_t& st) {
    // every SM's loader may wait on one router at once: back off, so their polls do not crowd the
    // counter's L2 slice while the router works
    const mvm_wait_t& w = ins->waits[st.index_wait];
    const uint32_t target = target_of(a, w, a.epoch + step);
    if (w.counter != seen_counter || (int32_t)(seen_target - target) < 0) {   // not seen reached yet
      if (!wait_until(a, w, target)) return false;
      seen_counter = w.counter;
      seen_target = target;
    }
    runs = st.index_count;
    const int32_t* src = (const int32_t*)a.ptrs[ins->inputs[st.index_slot]] + st.index_first;
    if (src != held_ids || 64 * step + runs != held_tag) {
#pragma unroll
      for (int j = 0; j < MEGAVM_MAX_TOPK; ++j)  // the ids in one round trip to L2
        if (j < runs) ids[j] = __ldcg(src + j);
      held_ids = src;
      held_tag = 64 * step + runs;
    }
    const mvm_buffer_t& b = a.buffers[st.buffer];
    experts = (int)b.shape[0];
    stride = b.nbytes / (uint64_t)b.shape[0];
    stack = (const unsigned char*)a.ptrs[st.buffer] + st.byte_offset;
    run_bytes = st.byte_count;
    run = 0;
    return true;
  }
  __device__ bool next(const mvm_args_t& a, uint32_t q0, uint32_t q1, uint32_t max_bytes, const unsigned char*& p,
                       uint32_t& n) {
    while (left == 0) {                          // open the next run or stream
      if (run < runs) {
        const int e = ids[run];
        if (e < 0 || e >= experts) {
          mvm_fail(a, MVM_ERR_BAD_INPUT, blockIdx.x, qi - q0, a.instrs + a.queue_entries[qi], -1, (uint32_t)e,
                   (uint32_t)experts);
          return false;
        }
        src = stack + (uint64_t)e * stride;
        left = run_bytes;
        in_late = true;
        ++run;
        continue;
      }
      if (step >= a.n_steps) return false;
      const mvm_instr_t* ins = a.instrs + a.queue_entries[qi];
      if (si < ins->n_streams) {
        const mvm_stream_t& st = ins->streams[si++];
        piece = max_bytes;
        in_late = false;
        if (st.index_slot == MEGAVM_STREAM_HISTORY) {
          if (!open_history(a, ins, st, max_bytes)) return false;
        } else if (st.index_slot >= 0) {
          if (!open_late(a, ins, st)) return false;
        } else {
          src = (const unsigned char*)a.ptrs[st.buffer] + st.byte_offset;
          left = st.byte_count;
          const mvm_buffer_t& b = a.buffers[st.buffer];
          // NVFP4 codes: the GEMV reads the rows' block scales (one byte per 8 code bytes) from global
          // memory; have them in L2 before the rows land
          if (b.dtype == MVM_E2M1) {              // nvfp4: a byte per 8 code bytes; mxfp4 (no row scales) per 16
            const uint32_t d = b.scale >= 0 ? 8 : 16;
            prefetch_l2((const unsigned char*)a.ptrs[b.block_scale] + st.byte_offset / d, st.byte_count / d);
          }
          // int4 codes: their group table, 4 bytes per 64 code bytes, the same way
          if (b.dtype == MVM_U4)
            prefetch_l2((const unsigned char*)a.ptrs[b.block_scale] + st.byte_offset / 16, st.byte_count / 16);
        }
      } else {
        si = 0;
        if (++qi == q1) { qi = q0; ++step; }
      }
    }
    n = (uint32_t)(left < piece ? left : piece);
    p = src;
    src += n;
    left -= n;
    return true;
  }
};

// A timing probe (MVM_PROBE_LOADER=1): how long a loader waited for copies to land and for a free
// ring stage; each eighth block prints its totals for the launch of epoch 5. Empty otherwise.
struct loader_probe {
#if MVM_PROBE_LOADER
  unsigned long long start = globaltimer(), full = 0, landing = 0, mark = 0, copies = 0;
  // late-bound (expert) copies alone: the same waits, their copies and bytes, the spans from a layer's first
  // late copy issued to its last, and the time in the walk (next(): a span's first copy's includes the wait
  // on the router) and in issuing; every timer read adds to what it measures
  unsigned long long lfull = 0, llanding = 0, lcopies = 0, lbytes = 0, lspan = 0, lfirst = 0, llast = 0, spans = 0;
  unsigned long long lnext = 0, lissue = 0, t_next = 0, t_issue = 0;   // late: time in next() and in the issue
  __device__ void next_begin() { t_next = globaltimer(); }
  __device__ void issue_begin() { t_issue = globaltimer(); }
  __device__ void issue_end() { if (late) lissue += globaltimer() - t_issue; }
  bool late = false;
  __device__ void kind(bool is_late, uint32_t n) {
    const unsigned long long now = globaltimer();
    if (is_late && !late) { lfirst = now; ++spans; }
    if (!is_late && late) lspan += llast - lfirst;
    late = is_late;
    if (late) { lbytes += n; ++lcopies; lnext += now - t_next; }
  }
  __device__ void begin() { mark = globaltimer(); }
  __device__ void landed() { const unsigned long long d = globaltimer() - mark; landing += d; if (late) llanding += d; }
  __device__ void ring_freed() {
    const unsigned long long now = globaltimer(), d = now - mark;
    full += d; ++copies;
    if (late) { lfull += d; llast = now; }
  }
  __device__ void report(const mvm_args_t& a) const {
    if (a.epoch == 5 && blockIdx.x % 8 == 0)
      printf("LOADER blk %u span_ns %llu ring_full_ns %llu landing_ns %llu copies %llu late_spans %llu late_span_ns %llu "
             "late_full_ns %llu late_landing_ns %llu late_copies %llu late_bytes %llu late_next_ns %llu "
             "late_issue_ns %llu\n", blockIdx.x, globaltimer() - start, full, landing, copies, spans, lspan, lfull,
             llanding, lcopies, lbytes, lnext, lissue);
  }
#else
  __device__ void kind(bool, uint32_t) {}
  __device__ void next_begin() {}
  __device__ void issue_begin() {}
  __device__ void issue_end() {}
  __device__ void begin() {}
  __device__ void landed() {}
  __device__ void ring_freed() {}
  __device__ void report(const mvm_args_t&) const {}
#endif
};

// The loader warp: stream every weight range of every instruction of this block's queue into the
// ring, in queue order (the queue once per step), never looking at counters. At most MVM_INFLIGHT
// copies are in flight at once: more only lengthens the memory queues that other SMs' latency-bound
// loads (activations, attention's K/V) wait behind (docs/performance.md). The program's last weight
// stage (MEGAVM_INSTR_LAST_STAGE: the LM head) has only its own tiles' loads of x beside it and no later
// task of the chain behind it, and takes MVM_LAST_INFLIGHT.
// Weights are read once a step, so their copies carry an L2 evict-first hint: the activations, KV
// cache and counters that the latency-bound steps read stay in L2.
__device__ void loader(const mvm_args_t& a, mvm_smem& s, uint32_t q0, uint32_t q1) {
#if MVM_HAS_RING
  if ((threadIdx.x & 31) != 0 || q0 == q1) return;
  int stage = 0;
  uint32_t phase = 0;
  uint64_t issued = 0;                           // copies issued so far
  weight_walk copy{0, q0, 0, nullptr, 0, 0, 0, false, {}, STAGE_BYTES, nullptr, 0, 0, 0, nullptr, 0, -1, 0};
  const unsigned char* src;
  uint32_t n;
  uint64_t policy;
  if (a.flags & MVM_FLAG_WEIGHTS_EVICT_NORMAL)
    asm volatile("createpolicy.fractional.L2::evict_normal.b64 %0, 1.0;" : "=l"(policy));
  else
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
  loader_probe probe;
  probe.next_begin();
  uint32_t inflight_qi = 0xffffffffu, inflight = MVM_INFLIGHT;
  while (copy.next(a, q0, q1, STAGE_BYTES, src, n)) {
    probe.kind(copy.in_late, n);
    if (MVM_LAST_INFLIGHT != MVM_INFLIGHT && copy.qi != inflight_qi) {   // the program's last weight stage: more
      inflight_qi = copy.qi;
      inflight = a.instrs[a.queue_entries[inflight_qi]].flags & MEGAVM_INSTR_LAST_STAGE ? MVM_LAST_INFLIGHT : MVM_INFLIGHT;
    }
    if (inflight < STAGES && issued >= inflight) {
      // wait until the copy issued `inflight` copies ago has landed
      const uint64_t old = issued - inflight;
      const uint32_t landed = smem_addr(&s.full[old % STAGES]);
      probe.begin();
      for (uint32_t spin = 0; !mbar_try_wait(landed, (uint32_t)(old / STAGES) & 1u); ++spin) {
        if ((spin & 1023) == 1023 && aborted(a)) return;
      }
      probe.landed();
    }
    const uint32_t empty = smem_addr(&s.empty[stage]);
    probe.begin();
    for (uint32_t spin = 0; !mbar_try_wait(empty, phase ^ 1u); ++spin) {
      if ((spin & 1023) == 1023 && aborted(a)) return;
    }
    probe.ring_freed();
    ++issued;
    probe.issue_begin();
    const uint32_t full = smem_addr(&s.full[stage]);
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(full), "r"(n) : "memory");
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, [%3], %4;"
        ::"r"(smem_addr(s.ring[stage])), "l"(src), "r"(n), "r"(full), "l"(policy) : "memory");
    if (++stage == STAGES) { stage = 0; phase ^= 1u; }
    probe.issue_end();
    probe.next_begin();
  }
  probe.report(a);
#endif
}

__device__ __forceinline__ void ring_init(mvm_smem& s) {
#if MVM_HAS_RING
  if (threadIdx.x == 0) {
    for (int i = 0; i < STAGES; ++i) {
      asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem_addr(&s.full[i])) : "memory");
      asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(&s.empty[i])), "n"(NCW) : "memory");
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
#endif
}

