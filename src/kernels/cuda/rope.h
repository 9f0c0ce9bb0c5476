// CUDA rotary position embedding (contract in kernels/rope.h), called by kernels/rope.cc after its
// checks. Plain C++ (no CUDA headers).
#pragma once
#include <vector>

#include "core/tensor.h"

namespace aerie::cuda {

/// In place on x (T, nh, d) F32|BF16 on the GPU, positions (T) I32 on the GPU; inv_freq (d/2 <= 512
/// entries, host) travels as a kernel argument. One thread per rotated pair. Throws aerie::Error when
/// d/2 > 512.
void rope_apply(Tensor& x, const Tensor& positions, const std::vector<float>& inv_freq, bool inverse);
/// Interleaved pairs (2i, 2i+1), times `scale` (contract in kernels/rope.h); as rope_apply otherwise.
void rope_apply_interleaved(Tensor& x, const Tensor& positions, const std::vector<float>& inv_freq, float scale);

}  // namespace aerie::cuda
