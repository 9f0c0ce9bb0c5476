// AdamW (Loshchilov & Hutter 2019; torch.optim.AdamW semantics, bias-corrected, decoupled decay):
// p -= lr * (wd * p + m_hat / (sqrt(v_hat) + eps)).
#pragma once
#include "core/tensor.h"

namespace aerie {

struct AdamWParams {
  float lr = 1e-4f, beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f, weight_decay = 0.0f;
};

/// param, grad, m, v: same shape, F32. step counts from 1 (for bias correction). Updates param, m, v.
void adamw_step(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v, const AdamWParams& p, int64_t step);

/// Sum of squares of all elements (double), for the global gradient norm.
double sum_squares(const Tensor& x);
/// x *= s (F32).
void scale_inplace(Tensor& x, float s);
/// y += x (F32, same numel).
void add_inplace(Tensor& y, const Tensor& x);

}  // namespace aerie
