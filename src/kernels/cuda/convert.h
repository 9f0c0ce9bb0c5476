// The CUDA conversion of kernels/convert.h. Plain C++ (no CUDA headers). Internal to src/kernels.
#pragma once
#include <cstdint>

#include "core/tensor.h"

namespace aerie::cuda {

/// dst (n) = src (n) converted, device pointers, on the current stream; the pair (F32<->BF16, I32<->I64)
/// is already checked by kernels/convert.cc. Bitwise the same results as the CPU. Returns once queued.
void convert(const void* src, DType src_dtype, void* dst, DType dst_dtype, int64_t n);

}  // namespace aerie::cuda
