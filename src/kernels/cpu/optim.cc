// CPU AdamW, op for op as torch.optim.AdamW's single-tensor path (_single_tensor_adam with decoupled
// weight decay), so the fp32 roundings match PyTorch's CPU path:
//   p *= 1 - lr wd;  m = lerp(m, g, 1 - b1);  v = v b2 + (1 - b2) g g;
//   denom = sqrt(v) / sqrt(1 - b2^t) + eps;  p += -(lr / (1 - b1^t)) m / denom
// Scalars (bias corrections, step size) in double as Python computes them, cast to fp32 at the op.
#include <cmath>

#include "kernels/cpu/cpu_kernels.h"

namespace aerie::cpu {

void adamw_step(float* param, const float* grad, float* m, float* v, int64_t n, const AdamWParams& p,
                int64_t step, float grad_scale) {
  const double lr = p.lr, b1 = p.beta1, b2 = p.beta2;
  const float decay = static_cast<float>(1.0 - lr * p.weight_decay);
  const float w1 = static_cast<float>(1.0 - b1);  // lerp weight
  const float fb2 = static_cast<float>(b2), w2 = static_cast<float>(1.0 - b2);
  const double bc1 = 1.0 - std::pow(b1, static_cast<double>(step));
  const double bc2 = 1.0 - std::pow(b2, static_cast<double>(step));
  const float neg_step_size = static_cast<float>(-(lr / bc1));
  const float bc2_sqrt = static_cast<float>(std::sqrt(bc2));
  const float eps = p.eps;
  for (int64_t i = 0; i < n; ++i) {
    const float g = grad[i] * grad_scale;  // exact when grad_scale = 1
    if (p.weight_decay != 0.0f) param[i] *= decay;
    // torch lerp: weight < 0.5 ? self + w (end - self) : end - (end - self) (1 - w)
    m[i] = w1 < 0.5f ? m[i] + w1 * (g - m[i]) : g - (g - m[i]) * (1.0f - w1);
    v[i] = v[i] * fb2 + w2 * g * g;
    const float denom = std::sqrt(v[i]) / bc2_sqrt + eps;
    param[i] = param[i] + neg_step_size * m[i] / denom;
  }
}

double sum_squares(const float* x, int64_t n) {
  double s = 0.0;
  for (int64_t i = 0; i < n; ++i) s += static_cast<double>(x[i]) * x[i];
  return s;
}

void scale_inplace(float* x, int64_t n, float s) {
  for (int64_t i = 0; i < n; ++i) x[i] *= s;
}

void add_inplace(float* y, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += x[i];
}

}  // namespace aerie::cpu
