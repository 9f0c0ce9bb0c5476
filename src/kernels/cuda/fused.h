// CUDA fused forward ops (contract in kernels/fused.h), called by kernels/fused.cc after its checks.
// Plain C++ (no CUDA headers).
#pragma once
#include <vector>

#include "core/tensor.h"

namespace aerie::cuda {

/// One block per (row, head), one thread per rotation pair (i, i + d/2); on the current stream.
void qkv_rope_forward(const Tensor& qkv, const Tensor& positions, const std::vector<float>& inv_freq,
                      const Tensor& q_norm, const Tensor& k_norm, float eps, Tensor& q, Tensor& k, Tensor& v);
/// One thread per output element.
void swiglu_packed_forward(const Tensor& gu, Tensor& out);
/// One block per row.
void add_rmsnorm_forward(Tensor& r, const Tensor& x, const Tensor& w, float eps, Tensor& y);

}  // namespace aerie::cuda
