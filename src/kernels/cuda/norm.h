// CUDA RMSNorm (contract in kernels/norm.h), called by kernels/norm.cc after its shape, dtype and device
// checks. Plain C++ (no CUDA headers): compiled by g++ in the dispatch and by nvcc in norm.cu.
#pragma once
#include "core/tensor.h"

namespace aerie::cuda {

/// One block per row: sum of squares (fp32, block reduction), then y = w (x rstd). Queued on the
/// current stream.
void rmsnorm_forward(const Tensor& x, const Tensor& w, float eps, Tensor& y, Tensor* rstd);
/// dw (if any) first, from fixed row chunks summed in order (deterministic), then dx one block per row.
void rmsnorm_backward(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& rstd, Tensor& dx,
                      Tensor* dw);

}  // namespace aerie::cuda
