// LL packets: data interleaved with a flag in one store, so a reader needs no separate signal.
// LL16: {data0, flag, data1, flag} in one 16-byte store (8 data bytes). LL8: {data, flag} (4 data bytes).
// A packet buffer is therefore twice the bytes of the data it carries. The flag is the execution's epoch,
// never 0, so zeroed scratch reads as "not arrived".
#pragma once
#include "common.cuh"

namespace weft {

__device__ __forceinline__ void ll16_store(void* p, u32 d0, u32 d1, u32 flag) {
  asm volatile("st.volatile.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(d0), "r"(flag), "r"(d1), "r"(flag)
               : "memory");
}

// Returns false on timeout; on success d0/d1 hold the payload.
__device__ __forceinline__ bool ll16_load(const void* p, u32 flag, u32& d0, u32& d1, Deadline& deadline) {
  u32 f0, f1;
  do {
    asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(d0), "=r"(f0), "=r"(d1), "=r"(f1)
                 : "l"(p)
                 : "memory");
    if (f0 == flag && f1 == flag) return true;
  } while (!deadline.expired());
  return false;
}

__device__ __forceinline__ void ll8_store(void* p, u32 d, u32 flag) {
  asm volatile("st.volatile.global.v2.u32 [%0], {%1, %2};" ::"l"(p), "r"(d), "r"(flag) : "memory");
}

__device__ __forceinline__ bool ll8_load(const void* p, u32 flag, u32& d, Deadline& deadline) {
  u32 f;
  do {
    asm volatile("ld.volatile.global.v2.u32 {%0, %1}, [%2];" : "=r"(d), "=r"(f) : "l"(p) : "memory");
    if (f == flag) return true;
  } while (!deadline.expired());
  return false;
}

struct alignas(16) Words4 { u32 x, y, z, w; };
struct alignas(8) Words2 { u32 x, y; };

// A unit of V data bytes (V = 16, 8 or 4) as V/4 words, moved as plain data or as packets.
template <int V>
struct Unit {
  u32 w[V / 4];
};

template <int V>
__device__ __forceinline__ void unit_load(const char* p, Unit<V>& u) {
  if constexpr (V == 16) {
    const Words4 v = *reinterpret_cast<const Words4*>(p);
    u.w[0] = v.x;
    u.w[1] = v.y;
    u.w[2] = v.z;
    u.w[3] = v.w;
  } else if constexpr (V == 8) {
    const Words2 v = *reinterpret_cast<const Words2*>(p);
    u.w[0] = v.x;
    u.w[1] = v.y;
  } else {
    u.w[0] = *reinterpret_cast<const u32*>(p);
  }
}

template <int V>
__device__ __forceinline__ void unit_store(char* p, const Unit<V>& u) {
  if constexpr (V == 16) {
    *reinterpret_cast<Words4*>(p) = Words4{u.w[0], u.w[1], u.w[2], u.w[3]};
  } else if constexpr (V == 8) {
    *reinterpret_cast<Words2*>(p) = Words2{u.w[0], u.w[1]};
  } else {
    *reinterpret_cast<u32*>(p) = u.w[0];
  }
}

// Packet forms of one unit: p points at the unit's 2V packet bytes.
template <int V>
__device__ __forceinline__ void unit_store_packets(char* p, const Unit<V>& u, u32 flag) {
  if constexpr (V == 4) {
    ll8_store(p, u.w[0], flag);
  } else {
#pragma unroll
    for (int k = 0; k < V / 8; ++k) ll16_store(p + 16 * k, u.w[2 * k], u.w[2 * k + 1], flag);
  }
}

template <int V>
__device__ __forceinline__ bool unit_load_packets(const char* p, Unit<V>& u, u32 flag, Deadline& deadline) {
  if constexpr (V == 4) {
    return ll8_load(p, flag, u.w[0], deadline);
  } else {
#pragma unroll
    for (int k = 0; k < V / 8; ++k) {
      if (!ll16_load(p + 16 * k, flag, u.w[2 * k], u.w[2 * k + 1], deadline)) return false;
    }
    return true;
  }
}

// The 2V packet bytes of one unit as fetched, before their flags are checked. Fetching every unit a thread holds
// in flight first and checking afterwards overlaps the loads; polling unit after unit would add their latencies.
template <int V>
struct Packets {
  Words4 p[V / 8];
};
template <>
struct Packets<4> {
  Words2 p[1];
};

template <int V>
__device__ __forceinline__ void packets_fetch(const char* p, Packets<V>& raw) {
  if constexpr (V == 4) {
    asm volatile("ld.volatile.global.v2.u32 {%0, %1}, [%2];" : "=r"(raw.p[0].x), "=r"(raw.p[0].y) : "l"(p) : "memory");
  } else {
#pragma unroll
    for (int k = 0; k < V / 8; ++k) {
      asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];"
                   : "=r"(raw.p[k].x), "=r"(raw.p[k].y), "=r"(raw.p[k].z), "=r"(raw.p[k].w)
                   : "l"(p + 16 * k)
                   : "memory");
    }
  }
}

// Whether every packet of the unit carries ``flag``; if so ``u`` holds its data.
template <int V>
__device__ __forceinline__ bool packets_ready(const Packets<V>& raw, u32 flag, Unit<V>& u) {
  if constexpr (V == 4) {
    u.w[0] = raw.p[0].x;
    return raw.p[0].y == flag;
  } else {
    bool ready = true;
#pragma unroll
    for (int k = 0; k < V / 8; ++k) {
      u.w[2 * k] = raw.p[k].x;
      u.w[2 * k + 1] = raw.p[k].z;
      ready = ready && raw.p[k].y == flag && raw.p[k].w == flag;
    }
    return ready;
  }
}

}  // namespace weft
