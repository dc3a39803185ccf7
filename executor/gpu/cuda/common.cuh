// Shared device definitions for weft's interpreter: the error record and bounded spinning.
// No CUDA headers are included so that NVRTC and nvcc compile these sources identically.
#pragma once

#include "contract.cuh"  // the integer types, the error kinds and the records, from the Python tables

// How the runners of one op (channel.cuh, ops.cuh) are linked: the interpreter leaves their inlining to the compiler
// (one call site each; run_pairs stays out of line so that the 1024-thread kernels keep their registers); a plan
// compiled to a kernel of its own (executor/gpu/compiled) inlines every one, so that its constant ops fold into the
// code instead of being stored to local memory for a call.
#ifndef WEFT_RUNNER
#define WEFT_RUNNER __device__
#endif
// A loop over an op's references or channels, ``var`` from ``from`` while below ``count`` (at most ``most``): the
// interpreter's counts are data; a compiled plan unrolls the loop to ``most`` so that each reference's index is a
// constant before its counts are known to be, and its op folds into registers instead of local memory.
#ifndef WEFT_FOR_EACH
#define WEFT_FOR_EACH(var, from, count, most) for (int var = from; var < count; ++var)
#endif
// The same loop ``step`` at a time (a group of references per turn).
#ifndef WEFT_FOR_EACH_STEP
#define WEFT_FOR_EACH_STEP(var, from, count, most, step) for (int var = from; var < count; var += step)
#endif
// An op's reference at a run-time index (run_pairs' turn): the interpreter indexes its op in shared memory; a compiled
// plan selects among its constant references (weft::ref_at), so that its op stays in registers.
#ifndef WEFT_REF_AT
#define WEFT_REF_AT(refs, i) refs[i]
#endif
#ifndef WEFT_PAIRS_RUNNER
#define WEFT_PAIRS_RUNNER __device__ __noinline__
#endif

namespace weft {

// ``refs[i]`` as a chain of selects over every entry (a compiled plan's WEFT_REF_AT): with constant entries the
// compiler keeps them in registers, where an index into the array would copy it to local memory first.
template <int N>
__device__ __forceinline__ Ref ref_at(const Ref (&refs)[N], int i) {
  Ref r = refs[0];
#pragma unroll
  for (int q = 1; q < N; ++q) {
    if (q == i) r = refs[q];
  }
  return r;
}

// The error record lives in mapped pinned host memory so the host reads it without synchronizing:
// [0] set, [1] kind, [2] rank, [3] threadblock, [4] op index in the plan, [5] channel (or -1), [6] barrier id.
struct ErrorRecord {
  volatile int* words;
  int rank;
};

__device__ __forceinline__ u64 global_timer_ns() {
  u64 t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__device__ __forceinline__ void report(ErrorRecord rec, int kind, int tb, int op, int channel, int barrier) {
  if (atomicCAS((int*)rec.words, 0, 1) == 0) {
    rec.words[1] = kind;
    rec.words[2] = rec.rank;
    rec.words[3] = tb;
    rec.words[4] = op;
    rec.words[5] = channel;
    rec.words[6] = barrier;
    __threadfence_system();
  }
}

// A spin with a wall-clock bound: the clock and the error flag are read only every 1024 polls, so a
// healthy wait costs one load per poll. expired() turns true on timeout or when another block failed.
struct Deadline {
  u64 timeout_ns;
  volatile int* error_set;
  u64 end = 0;
  u32 polls = 0;

  __device__ __forceinline__ Deadline(u64 timeout, volatile int* err) : timeout_ns(timeout), error_set(err) {}

  __device__ __forceinline__ bool expired() {
    if ((++polls & 1023u) != 0) return false;
    const u64 now = global_timer_ns();
    if (end == 0) end = now + timeout_ns;
    return now > end || *error_set != 0;
  }
};

}  // namespace weft
