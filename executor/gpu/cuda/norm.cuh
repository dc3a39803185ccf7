// The row-owning epilogue of a fused all-reduce + residual add + RMSNorm: one thread block normalizes the whole
// rows that its previous op (the reduction that completed their sums and added the residual) wrote, and writes
// ``rows * rsqrt(mean(rows^2) + eps) * weight`` in the element type. The arithmetic is fp32 and follows
// executor/reference/norm.py's numpy definition: x * rstd, then * weight, rounded once; rstd = 1 / sqrt(mean + eps)
// with IEEE division and square root. Only the order of the sum of squares differs (per thread, then the block).
#pragma once
#include "channel.cuh"

namespace weft {

// The epilogue's op kinds (contract.cuh): kNormRows, the rows a reduction completed, outside the op table's
// device kinds, which other ops extend. kNormPrefetch, first in a block that runs kNormRows or kNormSlice: the
// weight's lines prefetched into L1 (op.src[0], op.barrier_id bytes), so that its read from memory overlaps the
// reduction's wait for the peers' data instead of following it. kNormSlice: the epilogue over one slice of a row
// that several thread blocks sum together (a row split over k blocks, each completing the sum of 1/k of it): each
// block publishes its slice's sum of squares, gathers the row's k sums, and normalizes its own slice.

template <class D>
__device__ __forceinline__ void word_floats(u32 w, float (&f)[2]);
template <class D>
__device__ __forceinline__ u32 floats_word(const float (&f)[2]);

template <>
__device__ __forceinline__ void word_floats<BF16>(u32 w, float (&f)[2]) {
  f[0] = __uint_as_float(w << 16);
  f[1] = __uint_as_float(w & 0xffff0000u);
}
template <>
__device__ __forceinline__ u32 floats_word<BF16>(const float (&f)[2]) {
  u32 r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(f[1]), "f"(f[0]));
  return r;
}
template <>
__device__ __forceinline__ void word_floats<F16>(u32 w, float (&f)[2]) {
  const unsigned short lo = (unsigned short)(w & 0xffffu), hi = (unsigned short)(w >> 16);
  asm("cvt.f32.f16 %0, %1;" : "=f"(f[0]) : "h"(lo));
  asm("cvt.f32.f16 %0, %1;" : "=f"(f[1]) : "h"(hi));
}
template <>
__device__ __forceinline__ u32 floats_word<F16>(const float (&f)[2]) {
  u32 r;
  asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(f[1]), "f"(f[0]));
  return r;
}

// fp32 words hold one element; the second lane is unused.
template <class D>
struct Lanes {
  static constexpr int value = 2;
};
template <>
struct Lanes<F32> {
  static constexpr int value = 1;
};
template <>
__device__ __forceinline__ void word_floats<F32>(u32 w, float (&f)[2]) {
  f[0] = __uint_as_float(w);
  f[1] = 0.0f;
}
template <>
__device__ __forceinline__ u32 floats_word<F32>(const float (&f)[2]) {
  return __float_as_uint(f[0]);
}

// The sum of ``value`` over the block (every thread gets it). ``scratch``: 33 floats of shared memory.
__device__ __forceinline__ float block_sum(float value, float* scratch) {
  for (int d = 16; d > 0; d >>= 1) value += __shfl_xor_sync(0xffffffffu, value, d);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, warps = (blockDim.x + 31) >> 5;
  if (lane == 0) scratch[warp] = value;
  __syncthreads();
  if (warp == 0) {
    float v = lane < warps ? scratch[lane] : 0.0f;
    for (int d = 16; d > 0; d >>= 1) v += __shfl_xor_sync(0xffffffffu, v, d);
    if (lane == 0) scratch[32] = v;
  }
  __syncthreads();
  const float total = scratch[32];
  __syncthreads();  // scratch is reused by the next row
  return total;
}

// Each 128-byte line of ``bytes`` at ``p`` prefetched into L1 by the block's threads (fire and forget).
__device__ __forceinline__ void prefetch_lines(const char* p, i64 bytes) {
  for (i64 at = (i64)threadIdx.x * 128; at < bytes; at += (i64)blockDim.x * 128)
    asm volatile("prefetch.global.L1 [%0];" ::"l"(p + at));
}

// This thread's share of the sum of squares of ``units`` units of V bytes at ``p`` (fp32, in unit order).
template <class D, int V>
__device__ __forceinline__ float thread_squares(const char* p, int units) {
  float squares = 0.0f;
  for (int u = threadIdx.x; u < units; u += blockDim.x) {
    Unit<V> x;
    unit_load<V>(p + (i64)u * V, x);
#pragma unroll
    for (int w = 0; w < V / 4; ++w) {
      float f[2];
      word_floats<D>(x.w[w], f);
      squares += f[0] * f[0];
      if (Lanes<D>::value == 2) squares += f[1] * f[1];
    }
  }
  return squares;
}

// ``out`` = ``x * rstd * weight`` over ``units`` units of V bytes, rounded once to the element type.
template <class D, int V>
__device__ __forceinline__ void scale_store(const char* x_at, const char* weight, char* out, int units, float rstd) {
  for (int u = threadIdx.x; u < units; u += blockDim.x) {
    Unit<V> x, g, y;
    unit_load<V>(x_at + (i64)u * V, x);
    unit_load<V>(weight + (i64)u * V, g);
#pragma unroll
    for (int w = 0; w < V / 4; ++w) {
      float f[2], h[2];
      word_floats<D>(x.w[w], f);
      word_floats<D>(g.w[w], h);
      f[0] = __fmul_rn(__fmul_rn(f[0], rstd), h[0]);
      f[1] = __fmul_rn(__fmul_rn(f[1], rstd), h[1]);
      y.w[w] = floats_word<D>(f);
    }
    unit_store<V>(out + (i64)u * V, y);
  }
}

__device__ __forceinline__ void run_norm_prefetch(const Op& op, const Transfer& t) {
  prefetch_lines(t.base(op.src[0]), op.barrier_id);
}

// op.src[0]: the rows (the output just written), op.src[1]: the weight (one row), op.dst[0]: the normalized rows;
// op.bytes: the rows' bytes; op.barrier_id: one row's bytes; op.channel[0]: eps as fp32 bits. The rows' lines are
// prefetched into L1 first (so that a thread's loads of several units overlap without holding registers), then
// two passes over each row: the squares, then the scaled write.
template <class D, int V>
__device__ __forceinline__ void run_norm_rows(const Op& op, const Transfer& t) {
  __shared__ float scratch[33];
  const int row_bytes = op.barrier_id, units = row_bytes / V, rows = (int)(op.bytes / row_bytes);
  const float elems = (float)(row_bytes / (4 / Lanes<D>::value));
  prefetch_lines(t.base(op.src[0]), op.bytes);
  for (int r = 0; r < rows; ++r) {
    const char* row = t.base(op.src[0]) + (i64)r * row_bytes;
    const float squares = thread_squares<D, V>(row, units);
    const float rstd = 1.0f / sqrtf(block_sum(squares, scratch) / elems + __uint_as_float((u32)op.channel[0]));
    scale_store<D, V>(row, t.base(op.src[1]), t.base(op.dst[0]) + (i64)r * row_bytes, units, rstd);
  }
}

// op.src[0]: the slice (the output just written), op.src[1]: the weight's matching slice, op.src[2]: the row's k
// partial-sum slots (8 bytes each, in the scratch slot past the packets), op.dst[0]: the normalized slice;
// op.bytes: the slice's bytes; op.barrier_count: k, the slices of its row; op.barrier_id: this slice's index in
// the row; op.channel[0]: eps as fp32 bits.
// The exchange: thread 0 stores the block's sum of squares with the execution's flag in one 8-byte LL8 packet
// (so a stale slot from an earlier execution never matches, and no slot is ever reset: graph replays need no
// host help), then warp 0 polls the row's k slots, boundedly (``deadline``), and sums them in slot order with
// one butterfly, so that the k blocks of a row compute the same bits of rstd. Returns false on timeout (this
// thread's view; the caller reports it).
template <class D, int V>
__device__ __forceinline__ bool run_norm_slice(const Op& op, const Transfer& t, Deadline& deadline) {
  __shared__ float scratch[33];
  __shared__ float row_total;
  __shared__ int gathered;
  const int units = (int)(op.bytes / V), k = op.barrier_count;
  const float elems = (float)((op.bytes / (4 / Lanes<D>::value)) * k);
  const char* slice = t.base(op.src[0]);
  const float mine = block_sum(thread_squares<D, V>(slice, units), scratch);
  char* slots = t.base(op.src[2]);
  if (threadIdx.x == 0) ll8_store(slots + 8 * (i64)op.barrier_id, __float_as_uint(mine), t.flag);
  if (threadIdx.x < 32) {
    float total = 0.0f;
    bool ok = true;
    for (int s = threadIdx.x; s < k && ok; s += 32) {
      u32 d = 0;
      ok = ll8_load(slots + 8 * (i64)s, t.flag, d, deadline);
      total += __uint_as_float(d);
    }
    for (int d = 16; d > 0; d >>= 1) total += __shfl_xor_sync(0xffffffffu, total, d);
    ok = __all_sync(0xffffffffu, ok);
    if (threadIdx.x == 0) {
      row_total = total;
      gathered = ok ? 1 : 0;
    }
  }
  __syncthreads();
  if (!gathered) return false;
  const float rstd = 1.0f / sqrtf(row_total / elems + __uint_as_float((u32)op.channel[0]));
  scale_store<D, V>(slice, t.base(op.src[1]), t.base(op.dst[0]), units, rstd);
  return true;
}

}  // namespace weft
