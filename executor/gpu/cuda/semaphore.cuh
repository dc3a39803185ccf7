// Device-to-device semaphores. A signal is a remote release add on the peer's inbound counter; a wait takes the
// next ticket from the expected value held in device memory and acquire-polls the inbound counter until it
// reaches the ticket. Both counters only grow, so a captured CUDA graph replays without host help.
#pragma once
#include "common.cuh"

namespace weft {

__device__ __forceinline__ void semaphore_signal(u64* remote_inbound) {
  asm volatile("red.release.sys.global.add.u64 [%0], %1;" ::"l"(remote_inbound), "l"(1ULL) : "memory");
}

__device__ __forceinline__ u64 load_acquire_sys(const u64* p) {
  u64 v;
  asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ u64 load_acquire_gpu(const u64* p) {
  u64 v;
  asm volatile("ld.acquire.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}

// Returns false on timeout. The ticket comes from an atomic add so blocks sharing a channel stay consistent.
__device__ __forceinline__ bool semaphore_wait(const u64* inbound, u64* expected, Deadline& deadline) {
  const u64 ticket = atomicAdd(expected, 1ULL) + 1ULL;
  while (load_acquire_sys(inbound) < ticket) {
    if (deadline.expired()) return false;
  }
  return true;
}

// All-arrive barrier over `count` thread blocks of this GPU on a monotonic counter (graph-safe): arrival k
// waits until the counter reaches the end of its generation.
__device__ __forceinline__ bool block_barrier(u64* counter, int count, Deadline& deadline) {
  __threadfence();
  const u64 arrival = atomicAdd(counter, 1ULL);
  const u64 target = (arrival / (u64)count + 1ULL) * (u64)count;
  while (load_acquire_gpu(counter) < target) {
    if (deadline.expired()) return false;
  }
  return true;
}

}  // namespace weft
