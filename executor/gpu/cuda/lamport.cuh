// Lamport packets (schedules/lamport.py): the data is its own flag. Scratch words start as the sentinel, the dtype's
// negative zero (fp32 0x80000000, fp16 and bf16 0x8000); a sender maps -0.0 to +0.0 and writes the data alone (1x
// its bytes, no flag word); a reader polls the data words until no element holds the sentinel. A Lamport plan's
// scratch holds several copies that rotate by execution, and each execution writes the sentinel back over the copy
// that is free (kLamportReset, after the block's own ops).
#pragma once
#include "channel.cuh"

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

template <class D, int V>
__device__ __forceinline__ void lamport_store(char* p, const Unit<V>& u) {
  u32 w[V / 4];
#pragma unroll
  for (int k = 0; k < V / 4; ++k) w[k] = LamportWords<D>::to_wire(u.w[k]);
  if constexpr (V == 16) {
    asm volatile("st.volatile.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(w[0]), "r"(w[1]), "r"(w[2]),
                 "r"(w[3])
                 : "memory");
  } else if constexpr (V == 8) {
    asm volatile("st.volatile.global.v2.u32 [%0], {%1, %2};" ::"l"(p), "r"(w[0]), "r"(w[1]) : "memory");
  } else {
    asm volatile("st.volatile.global.u32 [%0], %1;" ::"l"(p), "r"(w[0]) : "memory");
  }
}

// One unit of a reference: a Lamport reference's polled until no element holds the sentinel, a plain one's loaded.
template <class D, int V>
__device__ __forceinline__ bool lamport_load_unit(const Transfer& t, const Ref& r, i64 unit, Unit<V>& out,
                                                  Deadline& deadline) {
  const char* p = t.base(r) + unit * V;
  if (r.flags & kLamport) return lamport_load<D, V>(p, out, deadline);
  unit_load<V>(p, out);
  return true;
}

// Units first, first + stride, ... (those below ``units``) of one reference into ``out``: a Lamport reference's
// units all fetched before any still holding the sentinel is polled again, a plain reference's loaded.
template <class D, int V>
__device__ __forceinline__ bool lamport_load_all(const Transfer& t, const Ref& r, i64 first, i64 stride, i64 units,
                                                 Unit<V> (&out)[kInFlight], Deadline& deadline) {
  const char* b = t.base(r);
  const bool polled = (r.flags & kLamport) != 0;
#pragma unroll
  for (int k = 0; k < kInFlight; ++k) {
    const i64 u = first + k * stride;
    if (u >= units) continue;
    if (polled) {
      lamport_fetch<V>(b + u * V, out[k]);
    } else {
      unit_load<V>(b + u * V, out[k]);
    }
  }
  if (!polled) return true;
#pragma unroll
  for (int k = 0; k < kInFlight; ++k) {
    const i64 u = first + k * stride;
    if (u < units && !lamport_arrived<D, V>(out[k]) && !lamport_load<D, V>(b + u * V, out[k], deadline)) return false;
  }
  return true;
}

// A transfer of a Lamport plan: run_transfer's loop, with Lamport references polled for the sentinel and written
// mapped. Batch: every source's units are loaded together (needs the registers of blocks of at most 256 threads);
// otherwise one unit after another. Returns false on a timeout (the caller reports it).
template <class D, int V, bool Batch>
__device__ __forceinline__ bool run_transfer_lamport(const Op& op, const Transfer& t, Deadline& deadline) {
  const i64 units = op.bytes / V;
  const i64 stride = (i64)blockDim.x;
  for (i64 first = threadIdx.x; first < units; first += kInFlight * stride) {
    Unit<V> acc[kInFlight];
    if constexpr (Batch) {
      if (!lamport_load_all<D, V>(t, op.src[0], first, stride, units, acc, deadline)) return false;
      for (int s = 1; s < op.nsrc; ++s) {
        Unit<V> x[kInFlight];
        if (!lamport_load_all<D, V>(t, op.src[s], first, stride, units, x, deadline)) return false;
#pragma unroll
        for (int k = 0; k < kInFlight; ++k) {
#pragma unroll
          for (int w = 0; w < V / 4; ++w) acc[k].w[w] = add_words<D>(acc[k].w[w], x[k].w[w]);
        }
      }
    } else {
#pragma unroll
      for (int k = 0; k < kInFlight; ++k) {
        const i64 u = first + k * stride;
        if (u < units && !lamport_load_unit<D, V>(t, op.src[0], u, acc[k], deadline)) return false;
      }
      for (int s = 1; s < op.nsrc; ++s) {
#pragma unroll
        for (int k = 0; k < kInFlight; ++k) {
          const i64 u = first + k * stride;
          if (u >= units) continue;
          Unit<V> x;
          if (!lamport_load_unit<D, V>(t, op.src[s], u, x, deadline)) return false;
#pragma unroll
          for (int w = 0; w < V / 4; ++w) acc[k].w[w] = add_words<D>(acc[k].w[w], x.w[w]);
        }
      }
    }
    for (int d = 0; d < op.ndst; ++d) {
      char* b = t.base(op.dst[d]);
      const bool mapped = (op.dst[d].flags & kLamport) != 0;
#pragma unroll
      for (int k = 0; k < kInFlight; ++k) {
        const i64 u = first + k * stride;
        if (u >= units) continue;
        if (mapped) {
          lamport_store<D, V>(b + u * V, acc[k]);
        } else {
          unit_store<V>(b + u * V, acc[k]);
        }
      }
    }
  }
  return true;
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
