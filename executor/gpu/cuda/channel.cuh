// The memory channel's data path: one plan op's bytes spread over the thread block in 16-byte (or 8/4-byte)
// units, read from any mix of local and peer (CUDA IPC) buffers, summed, and written to every destination.
// put, get, copy, the reductions and the packet ops are all this one loop with different references:
// a reference in packet form is read by polling its flags and written with the execution's flag, and, in the
// kernels that run Lamport plans, a Lamport reference (kLamport) by polling its data for the sentinel and written
// mapped (lamport.cuh).
#pragma once
#include "common.cuh"
#include "lamport.cuh"
#include "packet.cuh"
#include "reduce.cuh"

namespace weft {

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
// A Lamport transfer outside batch mode fetches this many sources' units before it polls any again: 1 (the
// interpreter, whose registers are spent) polls one source's unit at a time; a compiled plan sets more (compiled.cuh).
#ifndef WEFT_POLL_GROUP
#define WEFT_POLL_GROUP 1
#endif
// An LL128 transfer of more than two sources polls them as many at a time, line by line (run_transfer_lines).
constexpr int kPollGroup = WEFT_POLL_GROUP;

// One unit of a reference: a Lamport reference's polled until no element holds the sentinel, a plain one's loaded.
template <class D, int V>
__device__ __forceinline__ bool lamport_load_unit(const Transfer& t, const Ref& r, i64 unit, Unit<V>& out,
                                                  Deadline& deadline) {
  const char* p = t.base(r) + unit * V;
  if (r.flags & kLamport) return lamport_load<D, V>(p, out, deadline);
  unit_load<V>(p, out);
  return true;
}

// The fetched units x[g][k] (unit first + k * stride of source g, for g < ``live`` and below ``units``) of the
// watched sources polled again together until none holds the sentinel: each round fetches again every unit that
// still held it, all before any is checked, so that a round costs one trip to memory however many are late (settled
// one after another, each late unit after the first would cost a trip of its own).
template <class D, int V, int G, int K>
__device__ __forceinline__ bool lamport_settle_group(const char* const* b, const bool* watched, int live, i64 first,
                                                     i64 stride, i64 units, Unit<V> (&x)[G][K], Deadline& deadline) {
  while (true) {
    bool late = false;
#pragma unroll
    for (int g = 0; g < G; ++g) {
#pragma unroll
      for (int k = 0; k < K; ++k) {
        const i64 u = first + k * stride;
        if (g < live && watched[g] && u < units && !lamport_arrived<D, V>(x[g][k])) {
          late = true;
          lamport_fetch<V>(b[g] + u * V, x[g][k]);
        }
      }
    }
    if (!late) return true;
    if (deadline.expired()) return false;
  }
}

// Units first, first + stride, ... (those below ``units``) of one reference into ``out``: a Lamport reference's
// units all fetched, then polled again together (lamport_settle_group), a plain reference's loaded.
template <class D, int V>
__device__ __forceinline__ bool lamport_load_all(const Transfer& t, const Ref& r, i64 first, i64 stride, i64 units,
                                                 Unit<V> (&out)[kInFlight], Deadline& deadline) {
  const char* b[1] = {t.base(r)};
  const bool watched[1] = {(r.flags & kLamport) != 0};
  Unit<V> x[1][kInFlight];
#pragma unroll
  for (int k = 0; k < kInFlight; ++k) {
    const i64 u = first + k * stride;
    if (u >= units) continue;
    if (watched[0]) {
      lamport_fetch<V>(b[0] + u * V, x[0][k]);
    } else {
      unit_load<V>(b[0] + u * V, x[0][k]);
    }
  }
  const bool settled = lamport_settle_group<D, V, 1, kInFlight>(b, watched, 1, first, stride, units, x, deadline);
#pragma unroll
  for (int k = 0; k < kInFlight; ++k) out[k] = x[0][k];
  return settled;
}

// One unit of a reference fetched once, without waiting (a Lamport reference's words as they are now); the caller
// fetches other references' units beside it, so that their trips to memory overlap (run_transfer's
// WEFT_POLL_GROUP), and then settles them all together (lamport_settle_group). It takes the reference's address
// (Transfer::base) and whether it is polled (``watched``), worked out by the caller.
__device__ __forceinline__ bool polled(const Ref& r) { return (r.flags & kLamport) != 0; }

template <int V>
__device__ __forceinline__ void lamport_fetch_at(const char* b, bool watched, i64 unit, Unit<V>& out) {
  if (watched) {
    lamport_fetch<V>(b + unit * V, out);
  } else {
    unit_load<V>(b + unit * V, out);
  }
}

// The loads and stores of run_transfer: Transfer's, or, in a Lamport kernel, the Lamport forms.
template <class D, bool Lamport, int V>
__device__ __forceinline__ bool source_unit(const Transfer& t, const Ref& r, i64 unit, Unit<V>& out,
                                            Deadline& deadline) {
  if constexpr (Lamport) {
    return lamport_load_unit<D, V>(t, r, unit, out, deadline);
  } else {
    return t.load<V>(r, unit, out, deadline);
  }
}

template <class D, bool Lamport, int V>
__device__ __forceinline__ bool source_all(const Transfer& t, const Ref& r, i64 first, i64 stride, i64 units,
                                           Unit<V> (&out)[kInFlight], Deadline& deadline) {
  if constexpr (Lamport) {
    return lamport_load_all<D, V>(t, r, first, stride, units, out, deadline);
  } else {
    return t.load_all(r, first, stride, units, out, deadline);
  }
}

template <class D, bool Lamport, int V>
__device__ __forceinline__ void sink_unit(const Transfer& t, const Ref& r, i64 unit, const Unit<V>& value) {
  if constexpr (Lamport) {
    if (r.flags & kLamport) {
      lamport_store<D, V>(t.base(r) + unit * V, value);
    } else {
      unit_store<V>(t.base(r) + unit * V, value);
    }
  } else {
    t.store<V>(r, unit, value);
  }
}

// A Lamport kernel's stores of one group of units to every destination, each unit mapped to its wire form once (not
// once a peer). Batch kernels (128 registers) also take each reference's address once and then store every unit to
// one destination after another; in the others (64) the held addresses and wire forms spill, so there a unit is
// mapped and stored to every destination before the next, its address taken again each time (its slot is read
// from shared memory, which every volatile store's clobber makes the compiler read again).
template <class D, int V, bool Batch, int Refs = kMaxRefs>
__device__ __forceinline__ void lamport_sink(const Op& op, const Transfer& t, i64 first, i64 stride, i64 units,
                                             const Unit<V> (&acc)[kInFlight]) {
  bool mapped = false;
  WEFT_FOR_EACH(d, 0, op.ndst, Refs) { mapped = mapped || polled(op.dst[d]); }
  if constexpr (Batch) {
    Unit<V> wire[kInFlight];
    if (mapped) {
#pragma unroll
      for (int k = 0; k < kInFlight; ++k) {
        if (first + k * stride < units) wire[k] = lamport_wire<D, V>(acc[k]);
      }
    }
    WEFT_FOR_EACH(d, 0, op.ndst, Refs) {
      char* const b = t.base(op.dst[d]);
      const bool to_poll = polled(op.dst[d]);
#pragma unroll
      for (int k = 0; k < kInFlight; ++k) {
        const i64 u = first + k * stride;
        if (u >= units) continue;
        if (to_poll) {
          lamport_store_wire<V>(b + u * V, wire[k]);
        } else {
          unit_store<V>(b + u * V, acc[k]);
        }
      }
    }
  } else {
#pragma unroll
    for (int k = 0; k < kInFlight; ++k) {
      const i64 u = first + k * stride;
      if (u >= units) continue;
      Unit<V> wire;
      if (mapped) wire = lamport_wire<D, V>(acc[k]);
      WEFT_FOR_EACH(d, 0, op.ndst, Refs) {
        const Ref& r = op.dst[d];
        if (polled(r)) {
          lamport_store_wire<V>(t.base(r) + u * V, wire);
        } else {
          unit_store<V>(t.base(r) + u * V, acc[k]);
        }
      }
    }
  }
}

// Returns false on a packet timeout (the caller reports it). Batch: every source's units are loaded together
// (packets fetched before any is polled, see Transfer::load_all), which needs the registers of blocks of at
// most 256 threads; otherwise a source's units are loaded, and packets polled, one after another. Lamport: the
// transfer of a Lamport plan (its packets are Lamport data, lamport.cuh).
template <class D, int V, bool Batch, bool Lamport = false, int Refs = kMaxRefs>
WEFT_RUNNER bool run_transfer(const Op& op, const Transfer& t, Deadline& deadline) {
  const i64 units = op.bytes / V;
  const i64 stride = (i64)blockDim.x;
  for (i64 first = threadIdx.x; first < units; first += kInFlight * stride) {
    Unit<V> acc[kInFlight];
    if constexpr (Batch && Lamport && kPollGroup > 1) {
      // every unit of kPollGroup sources fetched before any is polled again: a one-shot's peers' copies then cost
      // one trip to memory, not one a peer (the sums keep their order: src[0], src[1], ... for every unit)
      if (!source_all<D, Lamport>(t, op.src[0], first, stride, units, acc, deadline)) return false;
#pragma unroll
      for (int s0 = 1; s0 < Refs; s0 += kPollGroup) {
        if (s0 >= op.nsrc) break;
        Unit<V> x[kPollGroup][kInFlight];
        const char* b[kPollGroup];
        bool watched[kPollGroup];
#pragma unroll
        for (int g = 0; g < kPollGroup; ++g) {
          b[g] = s0 + g < op.nsrc ? t.base(op.src[s0 + g]) : nullptr;
          watched[g] = s0 + g < op.nsrc && polled(op.src[s0 + g]);
        }
#pragma unroll
        for (int g = 0; g < kPollGroup; ++g) {
#pragma unroll
          for (int k = 0; k < kInFlight; ++k) {
            const i64 u = first + k * stride;
            if (s0 + g < op.nsrc && u < units) lamport_fetch_at<V>(b[g], watched[g], u, x[g][k]);
          }
        }
        if (!lamport_settle_group<D, V, kPollGroup, kInFlight>(b, watched, op.nsrc - s0, first, stride, units, x,
                                                               deadline)) {
          return false;
        }
#pragma unroll
        for (int g = 0; g < kPollGroup; ++g) {
          if (s0 + g >= op.nsrc) break;
#pragma unroll
          for (int k = 0; k < kInFlight; ++k) {
            if (first + k * stride >= units) continue;
#pragma unroll
            for (int w = 0; w < V / 4; ++w) acc[k].w[w] = add_words<D>(acc[k].w[w], x[g][k].w[w]);
          }
        }
      }
    } else if constexpr (Batch) {
      if (!source_all<D, Lamport>(t, op.src[0], first, stride, units, acc, deadline)) return false;
      WEFT_FOR_EACH(s, 1, op.nsrc, Refs) {
        Unit<V> x[kInFlight];
        if (!source_all<D, Lamport>(t, op.src[s], first, stride, units, x, deadline)) return false;
#pragma unroll
        for (int k = 0; k < kInFlight; ++k) {
#pragma unroll
          for (int w = 0; w < V / 4; ++w) acc[k].w[w] = add_words<D>(acc[k].w[w], x[k].w[w]);
        }
      }
    } else if constexpr (Lamport && kPollGroup > 1) {
      // a unit's sources fetched kPollGroup at a time before any is polled again: a one-shot's peers' copies of a
      // unit arrive at about the same time, and one trip to memory then serves them all
#pragma unroll
      for (int k = 0; k < kInFlight; ++k) {
        const i64 u = first + k * stride;
        if (u < units && !source_unit<D, Lamport>(t, op.src[0], u, acc[k], deadline)) return false;
      }
#pragma unroll
      for (int s0 = 1; s0 < Refs; s0 += kPollGroup) {
        if (s0 >= op.nsrc) break;
#pragma unroll
        for (int k = 0; k < kInFlight; ++k) {
          const i64 u = first + k * stride;
          if (u >= units) continue;
          Unit<V> x[kPollGroup][1];
          // each source's address taken again per unit: held across the units, they spill at 64 registers
          const char* b[kPollGroup];
          bool watched[kPollGroup];
#pragma unroll
          for (int g = 0; g < kPollGroup; ++g) {
            b[g] = s0 + g < op.nsrc ? t.base(op.src[s0 + g]) : nullptr;
            watched[g] = s0 + g < op.nsrc && polled(op.src[s0 + g]);
            if (s0 + g < op.nsrc) lamport_fetch_at<V>(b[g], watched[g], u, x[g][0]);
          }
          if (!lamport_settle_group<D, V, kPollGroup, 1>(b, watched, op.nsrc - s0, u, 0, units, x, deadline)) {
            return false;
          }
#pragma unroll
          for (int g = 0; g < kPollGroup; ++g) {
            if (s0 + g >= op.nsrc) continue;
#pragma unroll
            for (int w = 0; w < V / 4; ++w) acc[k].w[w] = add_words<D>(acc[k].w[w], x[g][0].w[w]);
          }
        }
      }
    } else {
#pragma unroll
      for (int k = 0; k < kInFlight; ++k) {
        const i64 u = first + k * stride;
        if (u < units && !source_unit<D, Lamport>(t, op.src[0], u, acc[k], deadline)) return false;
      }
      WEFT_FOR_EACH(s, 1, op.nsrc, Refs) {
#pragma unroll
        for (int k = 0; k < kInFlight; ++k) {
          const i64 u = first + k * stride;
          if (u >= units) continue;
          Unit<V> x;
          if (!source_unit<D, Lamport>(t, op.src[s], u, x, deadline)) return false;
#pragma unroll
          for (int w = 0; w < V / 4; ++w) acc[k].w[w] = add_words<D>(acc[k].w[w], x.w[w]);
        }
      }
    }
    if constexpr (Lamport) {
      lamport_sink<D, V, Batch, Refs>(op, t, first, stride, units, acc);
    } else {
      WEFT_FOR_EACH(d, 0, op.ndst, Refs) {
#pragma unroll
        for (int k = 0; k < kInFlight; ++k) {
          const i64 u = first + k * stride;
          if (u < units) sink_unit<D, Lamport>(t, op.dst[d], u, acc[k]);
        }
      }
    }
  }
  return true;
}

// A pairwise transfer of plain data (src[j] -> dst[j], every pair ``bytes`` long: a multi-peer put, get or copy)
// with the pairs side by side. Each thread walks groups of kInFlight units (blockDim apart), visiting every pair once
// per group, and starts at pair (warp + block) mod n: at any moment the warps of a block, and the blocks of the grid,
// move different pairs, so every peer's link carries data at once (pairs in series load one link at a time, and
// every instance the same one). Packet pairs stay one transfer per pair (executor/gpu/tables.py). Out of line, so
// that the 1024-thread kernels keep their registers.
template <int V>
WEFT_PAIRS_RUNNER void run_pairs(const Op& op, const Transfer& t) {
  const i64 units = op.bytes / V;
  const i64 stride = (i64)blockDim.x;
  const int n = op.nsrc, turn = (int)(threadIdx.x / 32 + blockIdx.x) % n;
  for (i64 first = threadIdx.x; first < units; first += kInFlight * stride) {
    for (int j = 0; j < n; ++j) {
      const int p = (j + turn) % n;
      const char* src = t.base(WEFT_REF_AT(op.src, p));
      char* dst = t.base(WEFT_REF_AT(op.dst, p));
      Unit<V> v[kInFlight];
#pragma unroll
      for (int k = 0; k < kInFlight; ++k) {
        const i64 u = first + k * stride;
        if (u < units) unit_load<V>(src + u * V, v[k]);
      }
#pragma unroll
      for (int k = 0; k < kInFlight; ++k) {
        const i64 u = first + k * stride;
        if (u < units) unit_store<V>(dst + u * V, v[k]);
      }
    }
  }
}

// LL128 transfers: a packet reference holds 128-byte lines of 120 data bytes and an 8-byte flag. Lane j (0..7)
// of an 8-lane group moves bytes [16j, 16j + 16) of its line's data in one 16-byte access, lane 7 only 8 bytes
// next to the flag; a warp's four lines are written by one store instruction, which NVLink delivers whole, so a
// reader that sees a line's flag sees its data (NCCL's LL128 relies on the same). Each chunk of ``line_chunk``
// data bytes starts a new line. Plain references are read and written 8 bytes at a time.
constexpr int kLineData = 120;

__device__ __forceinline__ void line_store(char* p, u64 w0, u64 w1) {
  asm volatile("st.volatile.global.v2.u64 [%0], {%1, %2};" ::"l"(p), "l"(w0), "l"(w1) : "memory");
}

__device__ __forceinline__ void line_load(const char* p, u64& w0, u64& w1) {
  asm volatile("ld.volatile.global.v2.u64 {%0, %1}, [%2];" : "=l"(w0), "=l"(w1) : "l"(p) : "memory");
}

template <class D>
__device__ __forceinline__ u64 add_u64(u64 a, u64 b) {
  const u32 lo = add_words<D>((u32)a, (u32)b), hi = add_words<D>((u32)(a >> 32), (u32)(b >> 32));
  return ((u64)hi << 32) | lo;
}

// The lines of sources s0 .. s0 + G - 1 (those below op.nsrc) that this lane moves (run_transfer_lines' U lines
// ``step`` apart from ``first``): a plain source's loaded once, the packet sources' all loaded again each round
// until every flag of the group has arrived, so that a round costs one trip to memory however many sources are
// late (one source polled to arrival before the next cost a trip for each late source after the first). False on a
// timeout, which every lane of the warp sees together.
template <int G, int U>
__device__ __forceinline__ bool load_line_group(const Op& op, int s0, const Transfer& t, int lane, i64 first, i64 step,
                                                i64 lines, const i64 (&data)[U], const bool (&has0)[U],
                                                const bool (&has1)[U], u64 (&w0)[G][U], u64 (&w1)[G][U],
                                                Deadline& deadline) {
  const u64 flag = t.flag;
  const char* p[G];
  bool packet[G];
  bool polling = false;
#pragma unroll
  for (int j = 0; j < G; ++j) {
    const bool live = s0 + j < op.nsrc;
    packet[j] = live && (op.src[s0 + j].flags & kPacket);
    p[j] = live ? t.base(op.src[s0 + j]) + (packet[j] ? 16 * lane : 0) : nullptr;
    polling = polling || packet[j];
#pragma unroll
    for (int k = 0; k < U; ++k) {
      w0[j][k] = live && !packet[j] && has0[k] ? *reinterpret_cast<const u64*>(p[j] + data[k]) : 0;
      w1[j][k] = live && !packet[j] && has1[k] ? *reinterpret_cast<const u64*>(p[j] + data[k] + 8) : 0;
    }
  }
  bool again = polling;  // alike on every lane: it depends on the op alone
  while (again) {
    bool late = false;
#pragma unroll
    for (int j = 0; j < G; ++j) {
      if (!packet[j]) continue;
#pragma unroll
      for (int k = 0; k < U; ++k) {
        const i64 g = first + k * step;
        w0[j][k] = w1[j][k] = 0;
        if (g < lines) line_load(p[j] + g * 128, w0[j][k], w1[j][k]);
        late = late || (g < lines && lane == 7 && w1[j][k] != flag);
      }
    }
    again = __any_sync(0xffffffffu, late);
    if (again && __any_sync(0xffffffffu, deadline.expired())) return false;  // every lane leaves together
  }
  return true;
}

// Returns false on a packet timeout. Whole warps walk the lines together (the flag vote needs every lane), each
// lane U lines apart so that U loads are in flight; a warp reloads its lines until every flag has arrived.
template <class D, int U, int Refs = kMaxRefs>
WEFT_RUNNER bool run_transfer_lines(const Op& op, const Transfer& t, Deadline& deadline) {
  const i64 chunk = op.line_chunk;
  const i64 per_chunk = (chunk + kLineData - 1) / kLineData;
  const i64 lines = op.bytes / chunk * per_chunk;
  const int lane = threadIdx.x & 7;
  const i64 step = (i64)(blockDim.x / 32) * 4;  // lines a whole block covers once
  const u64 flag = t.flag;
  for (i64 first = (threadIdx.x / 32) * 4 + ((threadIdx.x & 31) >> 3); first - ((threadIdx.x & 31) >> 3) < lines;
       first += step * U) {
    i64 data[U];
    bool has0[U], has1[U];
    u64 acc0[U], acc1[U];
#pragma unroll
    for (int k = 0; k < U; ++k) {
      const i64 g = first + k * step;
      const i64 c = g / per_chunk;
      data[k] = c * chunk + (g - c * per_chunk) * kLineData + 16 * lane;  // this lane's first data byte
      has0[k] = g < lines && data[k] + 8 <= (c + 1) * chunk;
      has1[k] = g < lines && lane < 7 && data[k] + 16 <= (c + 1) * chunk;
      acc0[k] = acc1[k] = 0;
    }
    bool grouped = false;
    if constexpr (kPollGroup > 1) grouped = op.nsrc > 2;  // a compiled op's count: one branch is compiled
    if (grouped) {
      // line by line, every source of the line kPollGroup at a time: a 4-rank one-shot's three peers share
      // their rounds (one line held a source, so that the 64-register kernels keep them in registers)
#pragma unroll
      for (int k = 0; k < U; ++k) {
        const i64 at[1] = {data[k]};
        const bool lo[1] = {has0[k]}, hi[1] = {has1[k]};
        WEFT_FOR_EACH_STEP(s0, 0, op.nsrc, Refs, kPollGroup) {
          u64 w0[kPollGroup][1], w1[kPollGroup][1];
          if (!load_line_group<kPollGroup, 1>(op, s0, t, lane, first + k * step, step, lines, at, lo, hi, w0, w1,
                                              deadline)) {
            return false;
          }
#pragma unroll
          for (int j = 0; j < kPollGroup; ++j) {
            if (s0 + j >= op.nsrc) break;
            acc0[k] = s0 + j == 0 ? w0[j][0] : add_u64<D>(acc0[k], w0[j][0]);
            acc1[k] = s0 + j == 0 ? w1[j][0] : add_u64<D>(acc1[k], w1[j][0]);
          }
        }
      }
    } else {
      // source by source, U lines of each in flight
      WEFT_FOR_EACH(s, 0, op.nsrc, Refs) {
        u64 w0[1][U], w1[1][U];
        if (!load_line_group<1, U>(op, s, t, lane, first, step, lines, data, has0, has1, w0, w1, deadline)) {
          return false;
        }
#pragma unroll
        for (int k = 0; k < U; ++k) {
          acc0[k] = s == 0 ? w0[0][k] : add_u64<D>(acc0[k], w0[0][k]);
          acc1[k] = s == 0 ? w1[0][k] : add_u64<D>(acc1[k], w1[0][k]);
        }
      }
    }
    WEFT_FOR_EACH(d, 0, op.ndst, Refs) {
      const Ref& r = op.dst[d];
      if (r.flags & kPacket) {
        char* p = t.base(r) + 16 * lane;
        __syncwarp();
#pragma unroll
        for (int k = 0; k < U; ++k) {
          const i64 g = first + k * step;
          if (g < lines) line_store(p + g * 128, acc0[k], lane == 7 ? flag : acc1[k]);
        }
      } else {
        char* p = t.base(r);
#pragma unroll
        for (int k = 0; k < U; ++k) {
          if (has0[k]) *reinterpret_cast<u64*>(p + data[k]) = acc0[k];
          if (has1[k]) *reinterpret_cast<u64*>(p + data[k] + 8) = acc1[k];
        }
      }
    }
  }
  return true;
}

}  // namespace weft
