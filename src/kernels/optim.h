// AdamW (Loshchilov & Hutter 2019; torch.optim.AdamW semantics, bias-corrected, decoupled decay):
// p -= lr * (wd * p + m_hat / (sqrt(v_hat) + eps)), and the gradient-norm helpers of clipping
// (torch.nn.utils.clip_grad_norm_).
#pragma once
#include <vector>

#include "core/tensor.h"

namespace aerie {

struct AdamWParams {
  float lr = 1e-4f, beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f, weight_decay = 0.0f;
};

/// param, grad, m, v: same shape, F32. step counts from 1 (for bias correction). Updates param, m, v.
void adamw_step(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v, const AdamWParams& p, int64_t step);

/// Global-norm clipping and AdamW over many tensors in one call, equal to
///   norm = sqrt(sum_i sum_squares(*grads[i]));
///   if (max_grad_norm > 0 && max_grad_norm / (norm + 1e-6) < 1) scale every grad by that (fp32) factor;
///   adamw_step(*params[i], *grads[i], *m[i], *v[i], p, step) for every i;
/// except that the grads are left unchanged (the factor is applied as they are read). Returns the norm
/// before clipping. params[i], grads[i], m[i], v[i]: same shape, F32, all on one device. On CUDA: one
/// launch of fp32 per-block partial sums, one reduction of them (in double, fixed order, so
/// deterministic), one update launch over all tensors, and one device-to-host copy of the norm (so
/// the call synchronises the current stream). The CPU sums in double, so the two norms agree to ~1e-6
/// relative. Throws aerie::Error naming the tensor index on a mismatch.
double adamw_step_clipped(const std::vector<Tensor*>& params, const std::vector<const Tensor*>& grads,
                          const std::vector<Tensor*>& m, const std::vector<Tensor*>& v, const AdamWParams& p,
                          int64_t step, double max_grad_norm);

/// Sum of squares of all elements (double; F32 or BF16), for the global gradient norm. On CUDA the
/// per-block partial sums are fp32 and their sum double; the call synchronises the current stream.
double sum_squares(const Tensor& x);
/// x *= s (F32 or BF16; fp32 multiply, rounded to x's dtype).
void scale_inplace(Tensor& x, float s);
/// y += x (each F32 or BF16, same numel; fp32 add, rounded to y's dtype).
void add_inplace(Tensor& y, const Tensor& x);

}  // namespace aerie
