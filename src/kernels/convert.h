// Elementwise dtype conversion between two tensors on one device (CPU or CUDA).
#pragma once
#include "core/tensor.h"

namespace aerie {

/// dst = src converted elementwise; src and dst have the same shape and device. Pairs:
///   F32 -> BF16: round to nearest even, NaN kept (quiet, sign and top payload bits kept), +-Inf kept,
///                overflow to +-Inf: exactly core/bf16.h's bf16::from_float, bitwise the same on CPU and CUDA
///                (the rounding of PyTorch's tensor.to(torch.bfloat16));
///   BF16 -> F32: exact;  I32 -> I64: exact;  I64 -> I32: static_cast (values outside int32 wrap modulo
///                2^32; not checked);  any dtype -> itself: a copy.
/// On CUDA the conversion is queued on the current stream and returns at once.
/// Throws aerie::Error naming the tensors on a shape/device mismatch or an unsupported pair.
void convert(const Tensor& src, Tensor& dst);

}  // namespace aerie
