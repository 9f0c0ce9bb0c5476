// CUDA AdamW, fused clipping + AdamW over many tensors, and the gradient-norm helpers (contracts in
// kernels/optim.h), called by kernels/optim.cc after its checks. Plain C++ (no CUDA headers).
#pragma once
#include <vector>

#include "core/tensor.h"
#include "kernels/optim.h"

namespace aerie::cuda {

void adamw_step(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v, const AdamWParams& p, int64_t step);
/// Launches: per-block fp32 partial sums of the squared grads, one block reducing them (double) into
/// the norm and clip factor on the device, one AdamW launch over all tensors (a device array of
/// tensor descriptors); then copies the norm to the host.
double adamw_step_clipped(const std::vector<Tensor*>& params, const std::vector<const Tensor*>& grads,
                          const std::vector<Tensor*>& m, const std::vector<Tensor*>& v, const AdamWParams& p,
                          int64_t step, double max_grad_norm);
double sum_squares(const Tensor& x);
void scale_inplace(Tensor& x, float s);
void add_inplace(Tensor& y, const Tensor& x);

}  // namespace aerie::cuda
