// The expert-parallel exchange of a capacity-padded mixture-of-experts layer (executor/gpu/experts.py states the
// layout and the rules), as DeepEP's low-latency kernels shape it: the exchange reads and writes the layer's own
// rows, so the layer needs no dispatch buffer, no reordering copies and no separate weighted sum.
//
// dispatch: each kept claim (token t's j-th expert, at dispatch row r = expert * capacity + place) copies token t's
//   row straight into the expert's rank's receive buffer, expert-major: (local expert, source rank, place).
// combine:  each expert output row goes straight back into its source rank's return buffer at the claim's dispatch
//   row; then every token's output is the sum of its kept rows weighted by their gates, in fp32, in the order
//   ((0 + row0 * gate0) + row1 * gate1), rounded once to the element type (torch's gather, multiply and sum).
//
// Arrival: the block that finishes its copies last stores the launch's epoch into a flag per (phase, source rank)
// on every rank (a release at system scope after a system fence), and waits where the phase needs the peers' rows
// (acquire). Epochs count launches on each rank; the ranks launch alike, so they agree. The flags only grow, so
// nothing is reset between launches. Every wait gives up after timeout_ns (globaltimer) and records which rank
// and peer it waited for in the host-mapped error words.
// No CUDA headers: NVRTC builds it as it is (element conversions in PTX, as reduce.cuh does).
typedef unsigned long long u64;
typedef unsigned short u16;

namespace {

constexpr int kDispatch = 0;  // flags[0 .. ranks): dispatch epochs by source rank; then combine's
constexpr int kCombine = 1;
// state words: the dispatch and combine epochs, then the blocks counted out of dispatch, combine's sends and its sums
constexpr int kDispatchEpoch = 0, kCombineEpoch = 1, kDispatchDone = 2, kCombineSent = 3, kCombineDone = 4;

__device__ __forceinline__ u64 load_acquire(const u64* p) {
  u64 v;
  asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ void store_release(u64* p, u64 v) {
  asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

__device__ __forceinline__ u64 now_ns() {
  u64 t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__device__ __forceinline__ void copy_row(uint4* dst, const uint4* src, int vecs) {
  for (int v = threadIdx.x; v < vecs; v += blockDim.x) dst[v] = src[v];
}

// Thread 0 of every block counts its block out (after each thread's system fence over its copies); the last one
// resets the counter and stores ``epoch`` into every rank's flag of (phase, this rank).
__device__ __forceinline__ void count_out(u64* counter, const u64* peer_flags, int phase, int rank, int ranks,
                                          u64 epoch) {
  __threadfence_system();
  __syncthreads();
  if (threadIdx.x == 0 && atomicAdd(counter, 1ULL) == gridDim.x - 1) {
    *counter = 0;
    __threadfence_system();
    for (int d = 0; d < ranks; ++d) store_release(reinterpret_cast<u64*>(peer_flags[d]) + phase * ranks + rank, epoch);
  }
}

// Threads 0 .. ranks-1 each wait until their source rank's flag of ``phase`` reaches ``epoch``; then the block's
// barrier. A wait past timeout_ns records (1, phase + 1, rank, source) in ``error`` and stops waiting.
__device__ __forceinline__ void await_flags(const u64* flags, int phase, int rank, int ranks, u64 epoch, u64 timeout_ns,
                                            int* error) {
  if (threadIdx.x < ranks) {
    const u64* flag = flags + phase * ranks + threadIdx.x;
    const u64 start = now_ns();
    while (load_acquire(flag) < epoch) {
      if (now_ns() - start > timeout_ns) {
        if (atomicCAS(error, 0, 1) == 0) {
          error[1] = phase + 1;
          error[2] = rank;
          error[3] = threadIdx.x;
        }
        break;
      }
    }
  }
  __syncthreads();
}

// The element types by their bits: bf16 and fp16 as 16-bit words, 8 to a vector; fp32, 4.
template <bool kBrain>
struct Half {
  typedef u16 Word;
  static constexpr int kPerVector = 8;
  static __device__ __forceinline__ float get(Word w) {
    if constexpr (kBrain) return __uint_as_float(static_cast<unsigned>(w) << 16);  // bf16 widens by a shift
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(w));
    return f;
  }
  static __device__ __forceinline__ Word put(float f) {
    Word w;
    if constexpr (kBrain) {
      asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(w) : "f"(f));
    } else {
      asm("cvt.rn.f16.f32 %0, %1;" : "=h"(w) : "f"(f));
    }
    return w;
  }
};
typedef Half<true> Bf16;
typedef Half<false> Fp16;

struct Fp32 {
  typedef float Word;
  static constexpr int kPerVector = 4;
  static __device__ __forceinline__ float get(Word w) { return w; }
  static __device__ __forceinline__ Word put(float f) { return f; }
};

template <typename E>
__device__ __forceinline__ void combine(const uint4* __restrict__ done, const long long* __restrict__ rows,
                                        long long rows_token, long long rows_choice, const float* __restrict__ gates,
                                        long long gates_token, long long gates_choice, uint4* __restrict__ out,
                                        const uint4* returned, int tokens, int top_k, const u64* peer_returned,
                                        const u64* peer_flags, u64* flags, u64* state, int* error, u64 timeout_ns,
                                        int rank, int ranks, int local, int capacity, int vecs) {
  typedef typename E::Word T;
  const u64 epoch = state[kCombineEpoch] + 1;  // every block reads it before the last one moves it on
  const int held = local * ranks * capacity;   // this rank's expert rows: (local expert, source rank, place)
  for (int i = blockIdx.x; i < held; i += gridDim.x) {
    const int le = i / (ranks * capacity), s = (i / capacity) % ranks, p = i % capacity;
    const long long at = (static_cast<long long>(rank * local + le) * capacity + p) * vecs;
    copy_row(reinterpret_cast<uint4*>(peer_returned[s]) + at, done + static_cast<long long>(i) * vecs, vecs);
  }
  count_out(state + kCombineSent, peer_flags, kCombine, rank, ranks, epoch);
  await_flags(flags, kCombine, rank, ranks, epoch, timeout_ns, error);
  const long long trash = static_cast<long long>(ranks) * local * capacity;
  for (int t = blockIdx.x; t < tokens; t += gridDim.x) {
    for (int v = threadIdx.x; v < vecs; v += blockDim.x) {
      float acc[E::kPerVector];
      for (int k = 0; k < E::kPerVector; ++k) acc[k] = 0.0f;
      for (int j = 0; j < top_k; ++j) {
        const long long r = rows[t * rows_token + j * rows_choice];
        if (r < 0 || r >= trash) continue;  // a dropped claim adds nothing
        const float w = gates[t * gates_token + j * gates_choice];
        const uint4 u = __ldcg(returned + r * vecs + v);  // written by peers: past this SM's L1
        const T* e = reinterpret_cast<const T*>(&u);
        for (int k = 0; k < E::kPerVector; ++k) acc[k] = __fadd_rn(acc[k], __fmul_rn(E::get(e[k]), w));
      }
      uint4 packed;
      T* o = reinterpret_cast<T*>(&packed);
      for (int k = 0; k < E::kPerVector; ++k) o[k] = E::put(acc[k]);
      out[static_cast<long long>(t) * vecs + v] = packed;
    }
  }
  __syncthreads();
  if (threadIdx.x == 0 && atomicAdd(state + kCombineDone, 1ULL) == gridDim.x - 1) {
    state[kCombineDone] = 0;
    state[kCombineEpoch] = epoch;
  }
}

}  // namespace

extern "C" __global__ void __launch_bounds__(1024)
    weft_experts_dispatch(const uint4* __restrict__ x, const long long* __restrict__ rows, long long rows_token,
                          long long rows_choice, int tokens, int top_k, const u64* peer_received, const u64* peer_flags,
                          u64* flags, u64* state, int* error, u64 timeout_ns, int rank, int ranks, int local,
                          int capacity, int vecs) {
  const u64 epoch = state[kDispatchEpoch] + 1;
  const long long trash = static_cast<long long>(ranks) * local * capacity;
  for (int c = blockIdx.x; c < tokens * top_k; c += gridDim.x) {
    const int t = c / top_k, j = c % top_k;
    const long long r = rows[t * rows_token + j * rows_choice];
    if (r < 0 || r >= trash) continue;  // dropped: the trash row stays on this rank
    const int e = static_cast<int>(r / capacity), p = static_cast<int>(r % capacity);
    const int d = e / local, le = e % local;
    const long long at =
        (static_cast<long long>(le) * ranks * capacity + static_cast<long long>(rank) * capacity + p) * vecs;
    copy_row(reinterpret_cast<uint4*>(peer_received[d]) + at, x + static_cast<long long>(t) * vecs, vecs);
  }
  __shared__ int last;
  __threadfence_system();
  __syncthreads();
  if (threadIdx.x == 0) {
    last = atomicAdd(state + kDispatchDone, 1ULL) == gridDim.x - 1;
    if (last) {
      state[kDispatchDone] = 0;
      __threadfence_system();
      for (int d = 0; d < ranks; ++d)
        store_release(reinterpret_cast<u64*>(peer_flags[d]) + kDispatch * ranks + rank, epoch);
    }
  }
  __syncthreads();
  if (!last) return;  // the kernel ends when the last block has seen every rank's rows arrive
  await_flags(flags, kDispatch, rank, ranks, epoch, timeout_ns, error);
  if (threadIdx.x == 0) state[kDispatchEpoch] = epoch;
}

#define WEFT_EXPERTS_COMBINE(NAME, T)                                                                                  \
  extern "C" __global__ void __launch_bounds__(1024) NAME(                                                             \
      const uint4* __restrict__ done, const long long* __restrict__ rows, long long rows_token, long long rows_choice, \
      const float* __restrict__ gates, long long gates_token, long long gates_choice, uint4* __restrict__ out,         \
      const uint4* returned, int tokens, int top_k, const u64* peer_returned, const u64* peer_flags, u64* flags,       \
      u64* state, int* error, u64 timeout_ns, int rank, int ranks, int local, int capacity, int vecs) {                \
    combine<T>(done, rows, rows_token, rows_choice, gates, gates_token, gates_choice, out, returned, tokens, top_k,    \
               peer_returned, peer_flags, flags, state, error, timeout_ns, rank, ranks, local, capacity, vecs);        \
  }

WEFT_EXPERTS_COMBINE(weft_experts_combine_bf16, Bf16)
WEFT_EXPERTS_COMBINE(weft_experts_combine_fp16, Fp16)
WEFT_EXPERTS_COMBINE(weft_experts_combine_fp32, Fp32)
