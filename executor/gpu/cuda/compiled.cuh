// A plan compiled to a kernel of its own (executor/gpu/compiled): the generated source defines a type whose thread
// blocks run their ops as constants, in straight-line code, and this header runs them between the interpreter's
// start and barriers, on the interpreter's context (the same parameters, slots, counters and epochs), so that one
// context can run either kernel, launch after launch. No op table is read: only the slot table, the block's range
// (to tell a disarmed graph record, which runs the tripwire op alone) and the epoch, each by threads of its own.
#pragma once
// Every op runner inlined: the constant ops then fold into the code (common.cuh).
#define WEFT_RUNNER __device__ __forceinline__
#define WEFT_PAIRS_RUNNER __device__ __forceinline__
#define WEFT_REF_AT(refs, i) weft::ref_at(refs, i)
// A unit's sources fetched this many at a time before a Lamport poll (channel.cuh): constant ops leave the registers.
#ifndef WEFT_POLL_GROUP
#define WEFT_POLL_GROUP 4
#endif
#define WEFT_FOR_EACH(var, from, count, most)                                          \
  _Pragma("unroll") for (int var = from; var < most; ++var) if (var >= (count)) break; \
  else
#define WEFT_FOR_EACH_STEP(var, from, count, most, step)                                     \
  _Pragma("unroll") for (int var = from; var < most; var += step) if (var >= (count)) break; \
  else
#include "ops.cuh"

namespace weft {

// Runs one op of a compiled plan with its type as a compile-time kind, then the block's barrier; false where the
// block failed. A functor, not a lambda, so that it is inlined at every op (a lambda called at many ops was not,
// and its op went to local memory).
template <class D, int V, bool Batch, bool Lamport>
struct Step {
  const Context& c;
  char* const* slots;
  u64& epoch;
  int& failed;
  const ErrorRecord rec;
#ifdef WEFT_TRACE
  Tracer& tracer;
#endif
  int done = 0;

  template <class Kind>
  __device__ __forceinline__ bool operator()(Kind, const Op& op) {
    run_op<D, V, Batch, Lamport, Kind::value, Kind::refs>(op, c, slots, epoch, failed, rec);
    __syncthreads();
    WEFT_TRACE_MARK(3 + done);
    ++done;
    return failed == 0;
  }

  // The same without the barrier: the generator found that the next op touches no memory this one (or any op since
  // the last barrier) writes or reads where it writes (source.py, ``barriers``), so each thread goes on when its own
  // units are done. Even a thread that failed goes on, so that every thread reaches the next barrier (where the block
  // stops together): once the error record is set, every wait ends at once (Deadline).
  template <class Kind>
  __device__ __forceinline__ bool unsynced(Kind, const Op& op) {
    run_op<D, V, Batch, Lamport, Kind::value, Kind::refs>(op, c, slots, epoch, failed, rec);
    WEFT_TRACE_MARK(3 + done);
    ++done;
    return true;
  }
};

// Plan: ``static bool expects(int block, int first, int end)``: whether the range the tables give the block is the
// compiled one (a disarmed graph record's is not: its block 0 runs only the tripwire op, the others nothing);
// ``template <class Step> static void run(int block, Step& step)``: the block's ops in order, each handed to
// ``step`` with its type as a type (KindOf), which returns false to stop; ``template <class Step> static void
// tripwire(Step& step)``.
template <class D, int V, bool Batch, bool Lamport, class Plan>
__device__ __forceinline__ void run_compiled(const Context& c) {
  WEFT_TRACE_START;
  // The interpreter's start without its op window: the slot table, the range and the epoch, by threads of their own.
  __shared__ char* slots[kMaxSlots];
  __shared__ int range[3];
  __shared__ u64 epoch;
  __shared__ int failed;
  block_start(c, slots, range, epoch, failed, threadIdx.x, blockDim.x, 64 % blockDim.x, 96 % blockDim.x);
  __syncthreads();
  give_back_epoch_if_disarmed(c, range);
  WEFT_TRACE_MARK(0);
  follow_previous_grid();
  WEFT_TRACE_MARK(1);
  const ErrorRecord rec{c.error, c.rank};
  WEFT_TRACE_MARK(2);  // no op window to wait for: the phases keep the interpreter's numbering
#ifdef WEFT_TRACE
  Step<D, V, Batch, Lamport> step{c, slots, epoch, failed, rec, tracer};
#else
  Step<D, V, Batch, Lamport> step{c, slots, epoch, failed, rec};
#endif
  bool ran = true;
  if (Plan::expects(blockIdx.x, range[0], range[1])) {
    ran = Plan::run(blockIdx.x, step);
  } else if (range[1] > range[0]) {
    ran = Plan::tripwire(step);
  }
  trigger_at_end();
  if (!ran) return;
  WEFT_TRACE_FINISH;
}

}  // namespace weft

// The kernel's parameters are the interpreter's (tables.KERNEL_PARAMS, contract.cuh): one context serves both.
#define WEFT_COMPILED(NAME, D, V, THREADS, PER_SM, BATCH, LAMPORT, PLAN)                                    \
  extern "C" __global__ void __launch_bounds__(THREADS, PER_SM) NAME(WEFT_KERNEL_PARAMS WEFT_TRACE_PARAM) { \
    const weft::Context c{WEFT_KERNEL_ARGS WEFT_TRACE_ARG};                                                 \
    weft::run_compiled<D, V, BATCH, LAMPORT, PLAN>(c);                                                      \
  }
