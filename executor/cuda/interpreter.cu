// weft's plan interpreter: one thread block per plan threadblock, walking its op list from the device tables
// built by executor/gpu_tables.py. Every wait is bounded; a timeout fills the error record and the block exits.
#include "channel.cuh"
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
  u64* state;            // [0] executions completed (the packet flag is this + 1), [1] blocks done
  volatile int* error;   // host-mapped error record
  u64 timeout_ns;
  int rank;
  i64 scratch_half;
};

__device__ __forceinline__ void load_op(const Op* src, Op* dst) {
  const int* s = reinterpret_cast<const int*>(src);
  int* d = reinterpret_cast<int*>(dst);
  for (int i = threadIdx.x; i < (int)(sizeof(Op) / sizeof(int)); i += blockDim.x) d[i] = s[i];
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

template <class D, int V>
__device__ void interpret(const Context& c) {
  __shared__ Op op;
  __shared__ int failed;
  const ErrorRecord rec{c.error, c.rank};
  if (threadIdx.x == 0) failed = 0;
  const u32 flag = (u32)(*(volatile u64*)c.state + 1ULL);
  const Transfer t{c.buffers, flag, (flag & 1u) ? c.scratch_half : 0};
  for (int i = c.tb_start[blockIdx.x]; i < c.tb_start[blockIdx.x + 1]; ++i) {
    load_op(c.ops + i, &op);
    __syncthreads();
    Deadline deadline(c.timeout_ns, c.error);
    if (op.type == kTransfer) {
      if (!run_transfer<D, V>(op, t, deadline)) {
        report(rec, kPacketTimeout, blockIdx.x, op.plan_op, -1, -1);
        failed = 1;
      }
    } else if (op.type == kFlush) {
      __threadfence_system();
    } else if (threadIdx.x == 0 && !run_control(op, c, rec, deadline)) {
      failed = 1;
    }
    __syncthreads();
    if (failed) return;
  }
  if (threadIdx.x == 0) {
    __threadfence();
    if (atomicAdd((u64*)(c.state + 1), 1ULL) == (u64)gridDim.x - 1ULL) {
      c.state[1] = 0;
      __threadfence();
      atomicAdd((u64*)c.state, 1ULL);
    }
  }
}

}  // namespace weft

#define WEFT_INTERPRETER(NAME, D, V)                                                                         \
  extern "C" __global__ void __launch_bounds__(1024)                                                          \
      NAME(const weft::Op* ops, const int* tb_start, char* const* buffers, u64* const* outbound, u64* inbound, \
           u64* expected, u64* barriers, u64* semaphores, u64* state, int* error, u64 timeout_ns, int rank, i64 scratch_half) { \
    const weft::Context c{ops,      tb_start, buffers, outbound,   inbound, expected,                         \
                          barriers, semaphores, state, error, timeout_ns, rank, scratch_half};                    \
    weft::interpret<D, V>(c);                                                                                 \
  }

WEFT_INTERPRETER(weft_interpret_f32_v16, weft::F32, 16)
WEFT_INTERPRETER(weft_interpret_f32_v8, weft::F32, 8)
WEFT_INTERPRETER(weft_interpret_f32_v4, weft::F32, 4)
WEFT_INTERPRETER(weft_interpret_f16_v16, weft::F16, 16)
WEFT_INTERPRETER(weft_interpret_f16_v8, weft::F16, 8)
WEFT_INTERPRETER(weft_interpret_f16_v4, weft::F16, 4)
WEFT_INTERPRETER(weft_interpret_bf16_v16, weft::BF16, 16)
WEFT_INTERPRETER(weft_interpret_bf16_v8, weft::BF16, 8)
WEFT_INTERPRETER(weft_interpret_bf16_v4, weft::BF16, 4)
