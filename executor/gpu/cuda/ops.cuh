// What a thread block runs for one op, shared by the interpreter (which reads its ops from the device tables) and the
// plans compiled to kernels of their own (executor/gpu/compiled, whose ops are constants): the kernel's context, the
// timed build's tracer, a block's start, the control ops and the dispatch of one device op.
#pragma once
#include "channel.cuh"
#include "lamport.cuh"
#include "norm.cuh"
#include "semaphore.cuh"

namespace weft {

struct Context {
  const Op* ops;
  const int* tb_start;   // ops of block b are ops[tb_start[b] .. tb_start[b+1])
  char* const* buffers;  // buffer slots (see Ref::buffer)
  u64* const* outbound;  // per channel: the peer's inbound counter this channel signals
  u64* inbound;          // per channel: counter the peer's paired channel signals
  u64* expected;         // per channel: waits taken so far
  u64* barriers;         // per barrier id: arrivals so far
  u64* semaphores;       // per plan semaphore k: [2k] releases (from its init value), [2k+1] acquires
  u64* epochs;           // per thread block: executions it started (an execution's packet flag is its epoch + 1)
  volatile int* error;   // host-mapped error record
  u64 timeout_ns;
  int rank;
  i64 scratch_half;  // one scratch half's bytes (double-buffered packet scratch), or one Lamport copy's
  int nslots;        // entries of the buffer slot table (at most kMaxSlots)
  int uniform_ops;   // ops per block where every block has as many (block b's start at b times it), else 0
#ifdef WEFT_TRACE
  u64* trace;  // per block kTraceSlots sums over launches (see Tracer)
#endif
};

#ifdef WEFT_TRACE
// A build with -DWEFT_TRACE times each block's phases with the SM clock: [0] slot table, op range and epoch,
// [1] the op window load and the wait for the previous grid, [2] the barrier after it, [3 + k] op k
// (k < kTraceOps; later ops add to the last), then the whole block in cycles and in global-timer nanoseconds.
// Sums over launches; thread 0 writes.
constexpr int kTraceOps = 16;
constexpr int kTraceSlots = 3 + kTraceOps + 2;
struct Tracer {
  u64* slot;
  long long first, last;
  u64 first_ns;
  __device__ __forceinline__ explicit Tracer(u64* s)
      : slot(s), first(clock64()), last(first), first_ns(global_timer_ns()) {}
  __device__ __forceinline__ void mark(int k) {
    const long long now = clock64();
    if (threadIdx.x == 0) slot[min(k, kTraceSlots - 3)] += (u64)(now - last);
    last = now;
  }
  __device__ __forceinline__ void finish() {
    if (threadIdx.x == 0) {
      slot[kTraceSlots - 2] += (u64)(clock64() - first);
      slot[kTraceSlots - 1] += global_timer_ns() - first_ns;
    }
  }
};
#define WEFT_TRACE_START Tracer tracer(c.trace + (u64)blockIdx.x * kTraceSlots)
#define WEFT_TRACE_MARK(k) tracer.mark(k)
#define WEFT_TRACE_FINISH tracer.finish()
#else
#define WEFT_TRACE_START
#define WEFT_TRACE_MARK(k)
#define WEFT_TRACE_FINISH
#endif

// The byte shift of the scratch an op reads and writes: with double-buffered packet scratch the half of the
// execution's flag (c.scratch_half is 0 for a single scratch); in a Lamport kernel the copy of the execution's epoch
// (a transfer's barrier_count: the plan's scratch copies; c.scratch_half: one copy's bytes).
template <bool Lamport>
__device__ __forceinline__ i64 scratch_shift(const Op& op, const Context& c, const volatile u64& epoch, u32 flag) {
  if constexpr (Lamport) {
    return op.barrier_count > 0 ? lamport_shift(epoch, 0, op.barrier_count, c.scratch_half) : 0;  // 0: tripwire
  } else {
    return (flag & 1u) ? c.scratch_half : 0;
  }
}

// Runs one control op on thread 0; returns false on timeout after reporting it. Its channel loops unroll to 16 in a
// compiled plan, not to the plan's bound (KindOf): a template on the bound put a two-shot's ops in local memory.
WEFT_RUNNER bool run_control(const Op& op, const Context& c, ErrorRecord rec, Deadline& deadline) {
  if (op.type == kSignal) {
    __threadfence_system();
    WEFT_FOR_EACH(i, 0, op.nchannel, kMaxChannels) semaphore_signal(c.outbound[op.channel[i]]);
  } else if (op.type == kWait) {
    WEFT_FOR_EACH(i, 0, op.nchannel, kMaxChannels) {
      const int ch = op.channel[i];
      if (!semaphore_wait(c.inbound + ch, c.expected + ch, deadline)) {
        report(rec, kWaitTimeout, blockIdx.x, op.plan_op, ch, -1);
        return false;
      }
    }
  } else if (op.type == kSemRelease) {
    __threadfence();
    WEFT_FOR_EACH(i, 0, op.nchannel, kMaxChannels) atomicAdd(c.semaphores + 2 * op.channel[i], 1ULL);
  } else if (op.type == kSemAcquire) {
    WEFT_FOR_EACH(i, 0, op.nchannel, kMaxChannels) {
      const int s = op.channel[i];
      if (!semaphore_wait(c.semaphores + 2 * s, c.semaphores + 2 * s + 1, deadline)) {
        report(rec, kWaitTimeout, blockIdx.x, op.plan_op, -2 - s, -1);
        return false;
      }
    }
  } else if (op.type == kBarrier) {
    if (!block_barrier(c.barriers + op.barrier_id, op.barrier_count, deadline)) {
      report(rec, kBarrierTimeout, blockIdx.x, op.plan_op, -1, op.barrier_id);
      return false;
    }
  }
  return true;
}

// Lets the next launch start its own table loads, then waits until the previous kernel has ended and its writes are
// visible (both are no-ops for a launch without the programmatic attribute, and absent before Hopper). A compiled
// kernel built with WEFT_LATE_TRIGGER lets the next launch start only at its own end (``trigger_at_end``), as
// FlashInfer's fused all-reduce does: an A/B of what the early start does to the kernels after it.
__device__ __forceinline__ void follow_previous_grid() {
#if __CUDA_ARCH__ >= 900
#ifndef WEFT_LATE_TRIGGER
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// Under WEFT_LATE_TRIGGER, a block's last word: the next launch may start once every block has said it.
__device__ __forceinline__ void trigger_at_end() {
#if __CUDA_ARCH__ >= 900 && defined(WEFT_LATE_TRIGGER)
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// A block's start: its buffer slots into shared memory by all its threads, its op range (range[0..1]) and whether
// the launch runs a disarmed graph record (range[2]: tables.BindingLayout, whose block 0 starts past op 0 where every
// armed table starts at 0) by one thread, and its epoch, taken and advanced in one atomic add (see interpret), by
// another, so that the trips to memory overlap.
__device__ __forceinline__ void block_start(const Context& c, char** slots, int* range, u64& epoch, int& failed, int t,
                                            int nt, int range_thread, int epoch_thread) {
  for (int i = t; i < c.nslots; i += nt) slots[i] = c.buffers[i];
  if (t == range_thread) {
    const int first = c.tb_start[blockIdx.x], end = c.tb_start[blockIdx.x + 1], zero = c.tb_start[0];
    range[0] = first;
    range[1] = end;
    range[2] = zero != 0;
  }
  if (t == epoch_thread) {
    failed = 0;
    epoch = atomicAdd(c.epochs + blockIdx.x, 1ULL);
  }
}

// After block_start's barrier: a launch of a disarmed graph record runs no plan op (only block 0's tripwire), so it
// gives back the epoch each block took, before it lets the next launch take one (the fence orders the add before
// launch_dependents, which follows the barrier). A Lamport plan resets by epoch: a launch that advanced it and ran
// no reset would leave a scratch copy holding old data that a later call reads as arrived.
__device__ __forceinline__ void give_back_epoch_if_disarmed(const Context& c, const int* range) {
  if (!range[2]) return;
  if (threadIdx.x == 0) {
    atomicAdd(c.epochs + blockIdx.x, ~0ULL);  // minus one
    __threadfence();
  }
  __syncthreads();
}

// Whether ``op`` is of ``kind``: the compile-time ``Kind`` where there is one (>= 0), else the op's type.
template <int Kind>
__device__ __forceinline__ bool is_kind(const Op& op, int kind) {
  if constexpr (Kind >= 0) {
    return Kind == kind;
  } else {
    return op.type == kind;
  }
}

// An op type as a type (a compiled plan hands its ops to run_op with it), with the most references or channels any
// op of the plan has (source.py's refs_bound): a transfer's loops over its references unroll that far and no further
// (unrolled to every Op's 16, they built all but the same code, 2-4x slower).
template <int K, int R = kMaxRefs>
struct KindOf {
  static constexpr int value = K;
  static constexpr int refs = R;
};

// Runs one device op with the block's threads (the caller synchronizes them after it). A failure is reported in the
// error record and sets ``failed``, which the block reads after that barrier. ``Kind``: the op's type where the caller
// knows it at compile time (a compiled plan), so that only its branch is compiled; -1: the op's ``type`` decides.
template <class D, int V, bool Batch, bool Lamport, int Kind = -1, int Refs = kMaxRefs>
__device__ __forceinline__ void run_op(const Op& op, const Context& c, char* const* slots, u64& epoch, int& failed,
                                       ErrorRecord rec) {
  Deadline deadline(c.timeout_ns, c.error);
  if (is_kind<Kind>(op, kPairs)) {
    const u32 flag = (u32)(*(volatile u64*)&epoch + 1ULL);
    run_pairs<V>(op, Transfer{slots, flag, scratch_shift<Lamport>(op, c, epoch, flag)});
  } else if (is_kind<Kind>(op, kTransfer)) {
    const u32 flag = (u32)(*(volatile u64*)&epoch + 1ULL);  // re-read: fewer live registers in the loop
    const Transfer tr{slots, flag, scratch_shift<Lamport>(op, c, epoch, flag)};
    bool moved;
    if constexpr (Lamport) {
      moved = run_transfer<D, V, Batch, true, Refs>(op, tr, deadline);
    } else {
      moved = op.line_chunk > 0 ? run_transfer_lines<D, Batch ? 4 : 2, Refs>(op, tr, deadline)
                                : run_transfer<D, V, Batch, false, Refs>(op, tr, deadline);
    }
    if (!moved) {
      report(rec, kPacketTimeout, blockIdx.x, op.plan_op, -1, -1);
      failed = 1;
    }
  } else if (is_kind<Kind>(op, kNormRows)) {
    run_norm_rows<D, V>(op, Transfer{slots, 0u, 0});
  } else if (is_kind<Kind>(op, kNormSlice)) {
    const u32 flag = (u32)(*(volatile u64*)&epoch + 1ULL);
    if (!run_norm_slice<D, V>(op, Transfer{slots, flag, 0}, deadline)) {
      report(rec, kNormTimeout, blockIdx.x, op.plan_op, -1, op.barrier_count);
      failed = 1;
    }
  } else if (is_kind<Kind>(op, kNormPrefetch)) {
    run_norm_prefetch(op, Transfer{slots, 0u, 0});
  } else if (is_kind<Kind>(op, kFlush)) {
    __threadfence_system();
  } else if (Lamport && is_kind<Kind>(op, kLamportReset)) {
    const i64 shift = lamport_shift(*(volatile u64*)&epoch, op.barrier_id, op.barrier_count, c.scratch_half);
    lamport_reset<D, V>(Transfer{slots, 0u, shift}.base(op.dst[0]), op.bytes);
  } else if (threadIdx.x == 0 && !run_control(op, c, rec, deadline)) {
    failed = 1;
  }
}

}  // namespace weft
