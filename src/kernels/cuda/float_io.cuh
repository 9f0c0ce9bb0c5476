// F32-or-BF16 arrays whose dtype is known at run time, for the memory-bound CUDA kernels of norm, rope,
// activation, embedding and optim: one kernel serves every dtype combination of its tensors. The dtype
// branch is uniform over the grid, so it costs nothing next to the memory traffic. Loads widen to fp32;
// stores round to nearest even (__float2bfloat16_rn, as Tensor::to(BF16) on the CPU). Internal to
// src/kernels/cuda.
#pragma once
#include "core/tensor.h"
#include "kernels/cuda/common.cuh"

namespace aerie::cuda {

/// Read-only F32 or BF16 elements.
struct CFloats {
  const void* p;
  bool bf16;
  __device__ __forceinline__ float operator[](int64_t i) const {
    return bf16 ? __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]) : static_cast<const float*>(p)[i];
  }
};

/// Read-write F32 or BF16 elements.
struct Floats {
  void* p;
  bool bf16;
  __device__ __forceinline__ float operator[](int64_t i) const {
    return bf16 ? __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]) : static_cast<const float*>(p)[i];
  }
  __device__ __forceinline__ void set(int64_t i, float v) const {
    if (bf16)
      static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(v);
    else
      static_cast<float*>(p)[i] = v;
  }
};

/// The elements of an F32 or BF16 tensor (dtype already checked by the caller).
inline CFloats cfloats(const Tensor& t) { return {t.raw(), t.dtype() == DType::BF16}; }
inline Floats floats(Tensor& t) { return {t.raw(), t.dtype() == DType::BF16}; }

/// Grid size along x for a kernel launch; throws aerie::Error when it exceeds CUDA's limit.
inline unsigned grid_x(int64_t blocks, const char* kernel) {
  AERIE_CHECK(blocks > 0 && blocks <= 0x7fffffffLL, kernel << ": grid of " << blocks << " blocks out of range");
  return static_cast<unsigned>(blocks);
}

}  // namespace aerie::cuda
