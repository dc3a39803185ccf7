// The memory channel's data path: one plan op's bytes spread over the thread block in 16-byte (or 8/4-byte)
// units, read from any mix of local and peer (CUDA IPC) buffers, summed, and written to every destination.
// put, get, copy, the reductions and the packet ops are all this one loop with different references:
// a reference in packet form is read by polling its flags and written with the execution's flag.
#pragma once
#include "common.cuh"
#include "packet.cuh"
#include "reduce.cuh"

namespace weft {

constexpr int kMaxRefs = 16;
constexpr int kMaxChannels = 16;
enum RefFlags : int { kPacket = 1, kScratch = 2 };

// Must match executor/gpu_tables.py (REF_DTYPE, OP_DTYPE).
struct Ref {
  i64 offset;  // bytes from the buffer's base (packet bytes for packet references)
  int buffer;  // slot in the context's buffer table: 0 input, 1 output, 2 scratch, 3+ peer buffers
  int flags;   // RefFlags
};

enum OpType : int { kNop = 0, kBarrier = 1, kSignal = 2, kWait = 3, kFlush = 4, kTransfer = 5, kSemAcquire = 6,
                    kSemRelease = 7 };

struct Op {
  int type, nsrc, ndst, nchannel;
  int barrier_id, barrier_count, plan_op, reserved;
  i64 bytes;  // data bytes moved by a transfer
  int channel[kMaxChannels];  // channel ids (signal, wait) or semaphore ids (sem_acquire, sem_release)
  Ref src[kMaxRefs];
  Ref dst[kMaxRefs];
};

static_assert(sizeof(Ref) == 16, "Ref layout is shared with executor/gpu_tables.py");
static_assert(sizeof(Op) == 616, "Op layout is shared with executor/gpu_tables.py");

struct Transfer {
  char* const* buffers;
  u32 flag;
  i64 scratch_shift;  // byte shift of the scratch half in use (double-buffered packet scratch)

  __device__ __forceinline__ char* base(const Ref& r) const {
    return buffers[r.buffer] + r.offset + ((r.flags & kScratch) ? scratch_shift : 0);
  }

  template <int V>
  __device__ __forceinline__ bool load(const Ref& r, i64 unit, Unit<V>& out, Deadline& deadline) const {
    if (r.flags & kPacket) return unit_load_packets<V>(base(r) + unit * (2 * V), out, flag, deadline);
    unit_load<V>(base(r) + unit * V, out);
    return true;
  }

  // The units first, first + stride, ... (N of them, those below ``units``) of one reference. Packets are all
  // fetched before any is waited for, and only those not yet arrived are polled again.
  template <int N, int V>
  __device__ __forceinline__ bool load_all(const Ref& r, i64 first, i64 stride, i64 units, Unit<V> (&out)[N],
                                           Deadline& deadline) const {
    const char* b = base(r);
    if (!(r.flags & kPacket)) {
#pragma unroll
      for (int k = 0; k < N; ++k) {
        const i64 u = first + k * stride;
        if (u < units) unit_load<V>(b + u * V, out[k]);
      }
      return true;
    }
    Packets<V> raw[N];
#pragma unroll
    for (int k = 0; k < N; ++k) {
      const i64 u = first + k * stride;
      if (u < units) packets_fetch<V>(b + u * (2 * V), raw[k]);
    }
#pragma unroll
    for (int k = 0; k < N; ++k) {
      const i64 u = first + k * stride;
      if (u < units && !packets_ready<V>(raw[k], flag, out[k]) &&
          !unit_load_packets<V>(b + u * (2 * V), out[k], flag, deadline)) {
        return false;
      }
    }
    return true;
  }

  template <int V>
  __device__ __forceinline__ void store(const Ref& r, i64 unit, const Unit<V>& value) const {
    if (r.flags & kPacket) {
      unit_store_packets<V>(base(r) + unit * (2 * V), value, flag);
    } else {
      unit_store<V>(base(r) + unit * V, value);
    }
  }
};

// Each thread keeps kInFlight units in flight so that peer reads over NVLink overlap.
constexpr int kInFlight = 4;

// Returns false on a packet timeout (the caller reports it). Batch: every source's units are loaded together
// (packets fetched before any is polled, see Transfer::load_all), which needs the registers of blocks of at
// most 256 threads; otherwise a source's units are loaded, and packets polled, one after another.
template <class D, int V, bool Batch>
__device__ bool run_transfer(const Op& op, const Transfer& t, Deadline& deadline) {
  const i64 units = op.bytes / V;
  const i64 stride = (i64)blockDim.x;
  for (i64 first = threadIdx.x; first < units; first += kInFlight * stride) {
    Unit<V> acc[kInFlight];
    if constexpr (Batch) {
      if (!t.load_all(op.src[0], first, stride, units, acc, deadline)) return false;
      for (int s = 1; s < op.nsrc; ++s) {
        Unit<V> x[kInFlight];
        if (!t.load_all(op.src[s], first, stride, units, x, deadline)) return false;
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
        if (u < units && !t.load<V>(op.src[0], u, acc[k], deadline)) return false;
      }
      for (int s = 1; s < op.nsrc; ++s) {
#pragma unroll
        for (int k = 0; k < kInFlight; ++k) {
          const i64 u = first + k * stride;
          if (u >= units) continue;
          Unit<V> x;
          if (!t.load<V>(op.src[s], u, x, deadline)) return false;
#pragma unroll
          for (int w = 0; w < V / 4; ++w) acc[k].w[w] = add_words<D>(acc[k].w[w], x.w[w]);
        }
      }
    }
    for (int d = 0; d < op.ndst; ++d) {
#pragma unroll
      for (int k = 0; k < kInFlight; ++k) {
        const i64 u = first + k * stride;
        if (u < units) t.store<V>(op.dst[d], u, acc[k]);
      }
    }
  }
  return true;
}

}  // namespace weft
