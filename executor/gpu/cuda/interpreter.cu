// weft's plan interpreter: one thread block per plan threadblock, walking its op list from the device tables
// built by executor/gpu/tables.py. Every wait is bounded; a timeout fills the error record and the block exits.
#include "ops.cuh"

namespace weft {

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

// Lamport: the kernels that run Lamport plans (executor/gpu/lamport.py); the others compile as if it did not exist.
template <class D, int V, bool Batch, bool Lamport>
__device__ void interpret(const Context& c) {
  __shared__ Op ops[kWindow];
  __shared__ char* slots[kMaxSlots];
  __shared__ int range[3];
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
  block_start(c, slots, range, epoch, failed, t, nt, range_thread, epoch_thread);
  __syncthreads();
  give_back_epoch_if_disarmed(c, range);
  WEFT_TRACE_MARK(0);
  // A record of a graph-captured execution may hold other ranges (a disarmed one runs only the tripwire op).
  if (range[0] != guess || range[1] - range[0] != c.uniform_ops)
    load_ops(c.ops + range[0], ops, min(kWindow, range[1] - range[0]));
  follow_previous_grid();  // only then is any buffer read
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
      run_op<D, V, Batch, Lamport>(ops[k], c, slots, epoch, failed, rec);
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
