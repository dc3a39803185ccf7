// Lamport packets (schedules/lamport.py): the data is its own flag. Scratch words start as the sentinel, the dtype's
// negative zero (fp32 0x80000000, fp16 and bf16 0x8000); a sender maps -0.0 to +0.0 and writes the data alone (1x
// its bytes, no flag word); a reader polls the data words until no element holds the sentinel. A Lamport plan's
// scratch holds several copies that rotate by execution, and each execution writes the sentinel back over the copy
// that is free (kLamportReset, before the block's first poll: executor/gpu/tables.py).
#pragma once
#include "packet.cuh"
#include "reduce.cuh"

namespace weft {

// The sentinel as a 32-bit word of the dtype's elements, whether a word holds it in any element, and a word as a
// sender writes it (each element's -0.0 turned into +0.0, every other bit pattern unchanged).
template <class D>
struct LamportWords {  // fp16 and bf16: two elements per word, each -0.0 is 0x8000
  static constexpr u32 kSentinel = 0x80008000u;
  __device__ __forceinline__ static bool holds_sentinel(u32 w) {
    return (w & 0xffffu) == 0x8000u || (w >> 16) == 0x8000u;
  }
  __device__ __forceinline__ static u32 to_wire(u32 w) {
    const u32 lo = (w & 0xffffu) == 0x8000u ? 0u : (w & 0xffffu);
    const u32 hi = (w >> 16) == 0x8000u ? 0u : (w & 0xffff0000u);
    return hi | lo;
  }
};

template <>
struct LamportWords<F32> {
  static constexpr u32 kSentinel = 0x80000000u;
  __device__ __forceinline__ static bool holds_sentinel(u32 w) { return w == kSentinel; }
  __device__ __forceinline__ static u32 to_wire(u32 w) { return w == kSentinel ? 0u : w; }
};

// One unit's V bytes as they are now (volatile: every poll goes to memory).
template <int V>
__device__ __forceinline__ void lamport_fetch(const char* p, Unit<V>& u) {
  if constexpr (V == 16) {
    asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(u.w[0]), "=r"(u.w[1]), "=r"(u.w[2]), "=r"(u.w[3])
                 : "l"(p)
                 : "memory");
  } else if constexpr (V == 8) {
    asm volatile("ld.volatile.global.v2.u32 {%0, %1}, [%2];" : "=r"(u.w[0]), "=r"(u.w[1]) : "l"(p) : "memory");
  } else {
    asm volatile("ld.volatile.global.u32 %0, [%1];" : "=r"(u.w[0]) : "l"(p) : "memory");
  }
}

// Whether every element of the unit has arrived. Each element is checked: a 16-byte store need not arrive whole,
// but each aligned 32-bit word does.
template <class D, int V>
__device__ __forceinline__ bool lamport_arrived(const Unit<V>& u) {
  bool arrived = true;
#pragma unroll
  for (int w = 0; w < V / 4; ++w) arrived = arrived && !LamportWords<D>::holds_sentinel(u.w[w]);
  return arrived;
}

// Polls one unit until it has arrived; false on timeout (or when another block failed).
template <class D, int V>
__device__ __forceinline__ bool lamport_load(const char* p, Unit<V>& u, Deadline& deadline) {
  do {
    lamport_fetch<V>(p, u);
    if (lamport_arrived<D, V>(u)) return true;
  } while (!deadline.expired());
  return false;
}

// One unit as a sender writes it: each element's -0.0 turned into +0.0 (LamportWords::to_wire).
template <class D, int V>
__device__ __forceinline__ Unit<V> lamport_wire(const Unit<V>& u) {
  Unit<V> w;
#pragma unroll
  for (int k = 0; k < V / 4; ++k) w.w[k] = LamportWords<D>::to_wire(u.w[k]);
  return w;
}

// A unit already in its wire form (lamport_wire) to p: mapped once, it may go to every peer.
template <int V>
__device__ __forceinline__ void lamport_store_wire(char* p, const Unit<V>& w) {
  if constexpr (V == 16) {
    asm volatile("st.volatile.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(w.w[0]), "r"(w.w[1]), "r"(w.w[2]),
                 "r"(w.w[3])
                 : "memory");
  } else if constexpr (V == 8) {
    asm volatile("st.volatile.global.v2.u32 [%0], {%1, %2};" ::"l"(p), "r"(w.w[0]), "r"(w.w[1]) : "memory");
  } else {
    asm volatile("st.volatile.global.u32 [%0], %1;" ::"l"(p), "r"(w.w[0]) : "memory");
  }
}

template <class D, int V>
__device__ __forceinline__ void lamport_store(char* p, const Unit<V>& u) {
  lamport_store_wire<V>(p, lamport_wire<D, V>(u));
}

// The sentinel over ``bytes`` (a multiple of V) from ``p``, by the block's threads: this rank's share of the copy
// a later execution uses. Plain stores: the kernel's end orders them before the next execution on the stream.
template <class D, int V>
__device__ __forceinline__ void lamport_reset(char* p, i64 bytes) {
  Unit<V> s;
#pragma unroll
  for (int k = 0; k < V / 4; ++k) s.w[k] = LamportWords<D>::kSentinel;
  const i64 units = bytes / V;
  for (i64 u = threadIdx.x; u < units; u += (i64)blockDim.x) unit_store<V>(p + u * V, s);
}

// The byte shift of the scratch copy an execution uses (ahead = 0) or resets (ahead = the plan's reset_ahead): copy
// (epoch + ahead) % copies, with the epoch counted per thread block from 0 on the device, so that a replayed CUDA
// graph rotates too. ``stride`` is one copy's bytes.
__device__ __forceinline__ i64 lamport_shift(u64 epoch, int ahead, int copies, i64 stride) {
  return (i64)((epoch + (u64)ahead) % (u64)copies) * stride;
}

}  // namespace weft
