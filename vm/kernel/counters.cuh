// Counters: the acquire loads a wait spins on and the release increments that signal, and the wait
// of one instruction, which times out (aborting the grid with a dump) instead of hanging.
#pragma once
#include "../../instructions/device.cuh"

// ---- memory-model primitives ---------------------------------------------------------------
__device__ __forceinline__ uint32_t ld_acquire(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void red_release(uint32_t* p, uint32_t v) {
  asm volatile("red.release.gpu.global.add.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
// The increment of a counter no wait on the GPU acquires (MEGAVM_INSTR_SIGNAL_RELAXED): no release.
__device__ __forceinline__ void red_relaxed(uint32_t* p, uint32_t v) {
  asm volatile("red.relaxed.gpu.global.add.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
// The increment of a signal whose counter has an inline waiter: it also acquires the other signals'
// writes, since the signaller that completes the wait runs the inline task on them. Returns the old value.
__device__ __forceinline__ uint32_t atom_acq_rel_add(uint32_t* p, uint32_t v) {
  uint32_t old;
  asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], %2;" : "=r"(old) : "l"(p), "r"(v) : "memory");
  return old;
}

// ---- counters ------------------------------------------------------------------------------
// Spin (acquire) until counter ctr reaches target; false on abort or timeout (with a dump).
__device__ bool wait_one(mvm_ctx& c, int ctr, uint32_t target) {
  const uint32_t* p = c.a.counters + ctr;
  uint32_t v = ld_acquire(p);
  if ((int32_t)(v - target) >= 0) return true;
  const unsigned long long t0 = globaltimer();
  for (uint32_t spin = 1;; ++spin) {
    __nanosleep(64);
    v = ld_acquire(p);
    if ((int32_t)(v - target) >= 0) return true;
    if ((spin & 31) == 0) {
      if (aborted(c.a)) return false;
      if (globaltimer() - t0 > c.a.timeout_ns) {
        mvm_fail(c.a, MVM_ERR_WAIT_TIMEOUT, c.block, c.qpos, c.ins, ctr, v, target);
        return false;
      }
    }
  }
}

// Thread 0 of the consumers waits for every counter of the instruction. A root (no waits) of a
// step after the launch's first also waits for the previous step's end. Returns false on abort.
__device__ bool wait_counters(mvm_ctx& c) {
  const mvm_instr_t* in = c.ins;
  if (in->n_waits == 0 && c.step > 0 && c.a.step_counter >= 0) {
    const int ctr = c.a.step_counter;
    if (!wait_one(c, ctr, c.epoch * c.a.producers[ctr])) return false;
  }
  for (int i = 0; i < in->n_waits; ++i) {
    if (in->flags & (MEGAVM_INSTR_POLLED_WAIT0 << i)) continue;    // the opcode polls its tagged inputs
    const int ctr = in->waits[i].counter;
    if (!wait_one(c, ctr, in->waits[i].threshold + c.epoch * c.a.producers[ctr])) return false;
  }
  return true;
}

