// Element-wise sums of packed words for fp32, fp16 and bf16 (two 16-bit lanes per 32-bit word).
#pragma once
#include "common.cuh"

namespace weft {

struct F32 {};
struct F16 {};
struct BF16 {};

template <class D>
__device__ __forceinline__ u32 add_words(u32 a, u32 b);

template <>
__device__ __forceinline__ u32 add_words<F32>(u32 a, u32 b) {
  u32 r;
  asm("{\n\t.reg .f32 x, y;\n\tmov.b32 x, %1;\n\tmov.b32 y, %2;\n\tadd.rn.f32 x, x, y;\n\tmov.b32 %0, x;\n\t}"
      : "=r"(r)
      : "r"(a), "r"(b));
  return r;
}

template <>
__device__ __forceinline__ u32 add_words<F16>(u32 a, u32 b) {
  u32 r;
  asm("add.rn.f16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
  return r;
}

// bf16 lanes widen exactly to fp32 by a shift; the sum is rounded once, as NCCL does.
template <>
__device__ __forceinline__ u32 add_words<BF16>(u32 a, u32 b) {
  u32 r;
  asm("{\n\t.reg .f32 alo, ahi, blo, bhi;\n\t"
      "shl.b32 %0, %1, 16;\n\tmov.b32 alo, %0;\n\t"
      "and.b32 %0, %1, 0xffff0000;\n\tmov.b32 ahi, %0;\n\t"
      "shl.b32 %0, %2, 16;\n\tmov.b32 blo, %0;\n\t"
      "and.b32 %0, %2, 0xffff0000;\n\tmov.b32 bhi, %0;\n\t"
      "add.rn.f32 alo, alo, blo;\n\tadd.rn.f32 ahi, ahi, bhi;\n\t"
      "cvt.rn.bf16x2.f32 %0, ahi, alo;\n\t}"
      : "=&r"(r)
      : "r"(a), "r"(b));
  return r;
}

}  // namespace weft
