// weft's plan interpreter: one thread block per plan threadblock, walking its op list from the device tables
// built by executor/gpu/tables.py. Every wait is bounded; a timeout fills the error record and the block exits.
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

// A block copies its buffer slots and up to kWindow of its ops into shared memory with all its threads at once,
// so that the latencies of these global loads overlap instead of adding up op after op.
constexpr int kWindow = 16;

// Copies ``count`` ops with the block's threads from ``first`` on (threads below it take no part).
__device__ __forceinline__ void load_ops(const Op* src, Op* dst, int count, int first = 0) {
  const int* s = reinterpret_cast<const int*>(src);
  int* d = reinterpret_cast<int*>(dst);
  const int words = count * (int)(sizeof(Op) / sizeof(int));
  for (int i = (int)threadIdx.x - first; i >= 0 && i < words; i += (int)blockDim.x - first) d[i] = s[i];
}

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

// Runs one control op on thread 0; returns false on timeout after reporting it.
__device__ bool run_control(const Op& op, const Context& c, ErrorRecord rec, Deadline& deadline) {
  if (op.type == kSignal) {
    __threadfence_system();
    for (int i = 0; i < op.nchannel; ++i) semaphore_signal(c.outbound[op.channel[i]]);
  } else if (op.type == kWait) {
    for (int i = 0; i < op.nchannel; ++i) {
      const int ch = op.channel[i];
      if (!semaphore_wait(c.inbound + ch, c.expected + ch, deadline)) {
        report(rec, kWaitTimeout, blockIdx.x, op.plan_op, ch, -1);
        return false;
      }
    }
  } else if (op.type == kSemRelease) {
    __threadfence();
    for (int i = 0; i < op.nchannel; ++i) atomicAdd(c.semaphores + 2 * op.channel[i], 1ULL);
  } else if (op.type == kSemAcquire) {
    for (int i = 0; i < op.nchannel; ++i) {
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

// Lamport: the kernels that run Lamport plans (executor/gpu/lamport.py); the others compile as if it did not exist.
template <class D, int V, bool Batch, bool Lamport>
__device__ void interpret(const Context& c) {
  __shared__ Op ops[kWindow];
  __shared__ char* slots[kMaxSlots];
  __shared__ int range[2];
  __shared__ u64 epoch;
  __shared__ int failed;
  const ErrorRecord rec{c.error, c.rank};
  WEFT_TRACE_START;
  // The static tables first (the slot table, this block's op range and its first window of ops): with a
  // programmatic launch these loads overlap the end of the kernel before this one on the stream. Each is loaded by
  // threads of its own, so that their trips to memory overlap (a thread waits for its load before it goes on):
  // the slot table by the first two warps, the range and the epoch by one thread of two other warps, and, where
  // every block runs as many ops (block b's then start at b times their count), the first window by the threads
  // from the fifth warp on, checked against the range once it is known. Small blocks fold the roles together.
  // So does the epoch: each launch takes its block's epoch and advances it in one atomic add before it lets the
  // next launch start (the add is performed in L2 once its old value returns, before the barrier that every
  // thread passes on its way to launch_dependents below), and a launch starts only once every block of the one
  // before it has passed that point, or, launched without the attribute, once it ended. So the value taken here
  // is the previous launch's plus one, without waiting for that launch to end.
  const int t = threadIdx.x, nt = blockDim.x;
  const int range_thread = 64 % nt, epoch_thread = 96 % nt, guess_from = nt > 128 ? 128 : 0;
  const int guess = c.uniform_ops > 0 ? (int)blockIdx.x * c.uniform_ops : -1;
  if (guess >= 0) load_ops(c.ops + guess, ops, min(kWindow, c.uniform_ops), guess_from);
  for (int i = t; i < c.nslots; i += nt) slots[i] = c.buffers[i];
  if (t == range_thread) {
    const int first = c.tb_start[blockIdx.x], end = c.tb_start[blockIdx.x + 1];
    range[0] = first;
    range[1] = end;
  }
  if (t == epoch_thread) {
    failed = 0;
    epoch = atomicAdd(c.epochs + blockIdx.x, 1ULL);
  }
  __syncthreads();
  WEFT_TRACE_MARK(0);
  // A record of a graph-captured execution may hold other ranges (a disarmed one runs only the tripwire op).
  if (range[0] != guess || range[1] - range[0] != c.uniform_ops)
    load_ops(c.ops + range[0], ops, min(kWindow, range[1] - range[0]));
  // Let the next launch start its own table loads, then wait until the previous kernel has ended and its writes
  // are visible (both are no-ops for a launch without the programmatic attribute). Only then is any buffer read.
#if __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
  WEFT_TRACE_MARK(1);
  __syncthreads();  // the op window in shared memory
  WEFT_TRACE_MARK(2);
  for (int first = range[0]; first < range[1]; first += kWindow) {
    const int count = min(kWindow, range[1] - first);
    if (first != range[0]) {
      load_ops(c.ops + first, ops, count);
      __syncthreads();
    }
    for (int k = 0; k < count; ++k) {
      const Op& op = ops[k];
      Deadline deadline(c.timeout_ns, c.error);
      if (op.type == kPairs) {
        const u32 flag = (u32)(*(volatile u64*)&epoch + 1ULL);
        run_pairs<V>(op, Transfer{slots, flag, scratch_shift<Lamport>(op, c, epoch, flag)});
      } else if (op.type == kTransfer) {
        const u32 flag = (u32)(*(volatile u64*)&epoch + 1ULL);  // re-read: fewer live registers in the loop
        const Transfer tr{slots, flag, scratch_shift<Lamport>(op, c, epoch, flag)};
        bool moved;
        if constexpr (Lamport) {
          moved = run_transfer<D, V, Batch, true>(op, tr, deadline);
        } else {
          moved = op.line_chunk > 0 ? run_transfer_lines<D, Batch ? 4 : 2>(op, tr, deadline)
                                    : run_transfer<D, V, Batch>(op, tr, deadline);
        }
        if (!moved) {
          report(rec, kPacketTimeout, blockIdx.x, op.plan_op, -1, -1);
          failed = 1;
        }
      } else if (op.type == kNormRows) {
        run_norm_rows<D, V>(op, Transfer{slots, 0u, 0});
      } else if (op.type == kNormSlice) {
        const u32 flag = (u32)(*(volatile u64*)&epoch + 1ULL);
        if (!run_norm_slice<D, V>(op, Transfer{slots, flag, 0}, deadline)) {
          report(rec, kNormTimeout, blockIdx.x, op.plan_op, -1, op.barrier_count);
          failed = 1;
        }
      } else if (op.type == kNormPrefetch) {
        run_norm_prefetch(op, Transfer{slots, 0u, 0});
      } else if (op.type == kFlush) {
        __threadfence_system();
      } else if (Lamport && op.type == kLamportReset) {
        const i64 shift = lamport_shift(*(volatile u64*)&epoch, op.barrier_id, op.barrier_count, c.scratch_half);
        lamport_reset<D, V>(Transfer{slots, 0u, shift}.base(op.dst[0]), op.bytes);
      } else if (t == 0 && !run_control(op, c, rec, deadline)) {
        failed = 1;
      }
      __syncthreads();
      WEFT_TRACE_MARK(3 + first - range[0] + k);
      if (failed) return;
    }
  }
  WEFT_TRACE_FINISH;
}

}  // namespace weft

// The kernel's parameters and the context's fields in one order: tables.KERNEL_PARAMS (contract.cuh).
#define WEFT_INTERPRETER_OF(NAME, D, V, THREADS, PER_SM, BATCH, LAMPORT)                                    \
  extern "C" __global__ void __launch_bounds__(THREADS, PER_SM) NAME(WEFT_KERNEL_PARAMS WEFT_TRACE_PARAM) { \
    const weft::Context c{WEFT_KERNEL_ARGS WEFT_TRACE_ARG};                                                 \
    weft::interpret<D, V, BATCH, LAMPORT>(c);                                                               \
  }
#define WEFT_INTERPRETER(NAME, D, V, THREADS, PER_SM, BATCH)     \
  WEFT_INTERPRETER_OF(NAME, D, V, THREADS, PER_SM, BATCH, false) \
  WEFT_INTERPRETER_OF(NAME##_lamport, D, V, THREADS, PER_SM, BATCH, true)

WEFT_INTERPRETER(weft_interpret_f32_v16, weft::F32, 16, 1024, 1, false)
WEFT_INTERPRETER(weft_interpret_f32_v16_b256, weft::F32, 16, 256, 2, true)
WEFT_INTERPRETER(weft_interpret_f32_v8, weft::F32, 8, 1024, 1, false)
WEFT_INTERPRETER(weft_interpret_f32_v8_b256, weft::F32, 8, 256, 2, true)
WEFT_INTERPRETER(weft_interpret_f32_v4, weft::F32, 4, 1024, 1, false)
WEFT_INTERPRETER(weft_interpret_f32_v4_b256, weft::F32, 4, 256, 2, true)
WEFT_INTERPRETER(weft_interpret_f16_v16, weft::F16, 16, 1024, 1, false)
WEFT_INTERPRETER(weft_interpret_f16_v16_b256, weft::F16, 16, 256, 2, true)
WEFT_INTERPRETER(weft_interpret_f16_v8, weft::F16, 8, 1024, 1, false)
WEFT_INTERPRETER(weft_interpret_f16_v8_b256, weft::F16, 8, 256, 2, true)
WEFT_INTERPRETER(weft_interpret_f16_v4, weft::F16, 4, 1024, 1, false)
WEFT_INTERPRETER(weft_interpret_f16_v4_b256, weft::F16, 4, 256, 2, true)
WEFT_INTERPRETER(weft_interpret_bf16_v16, weft::BF16, 16, 1024, 1, false)
WEFT_INTERPRETER(weft_interpret_bf16_v16_b256, weft::BF16, 16, 256, 2, true)
WEFT_INTERPRETER(weft_interpret_bf16_v8, weft::BF16, 8, 1024, 1, false)
WEFT_INTERPRETER(weft_interpret_bf16_v8_b256, weft::BF16, 8, 256, 2, true)
WEFT_INTERPRETER(weft_interpret_bf16_v4, weft::BF16, 4, 1024, 1, false)
WEFT_INTERPRETER(weft_interpret_bf16_v4_b256, weft::BF16, 4, 256, 2, true)
