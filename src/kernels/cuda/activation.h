// CUDA SwiGLU (contract in kernels/activation.h), called by kernels/activation.cc after its checks.
// Plain C++ (no CUDA headers).
#pragma once
#include "core/tensor.h"

namespace aerie::cuda {

/// Elementwise, one thread per element, on the current stream.
void swiglu_forward(const Tensor& gate, const Tensor& up, Tensor& out);
void swiglu_backward(const Tensor& dout, const Tensor& gate, const Tensor& up, Tensor& dgate, Tensor& dup);

}  // namespace aerie::cuda
