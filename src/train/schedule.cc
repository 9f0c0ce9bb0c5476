#include "train/schedule.h"

#include <cmath>
#include <numbers>

#include "kernels/optim.h"

namespace aerie {

LrSchedule LrSchedule::make(double base_lr, int64_t total_steps, double warmup_ratio) {
  AERIE_CHECK(total_steps >= 1, "lr schedule: total steps must be >= 1, got " << total_steps);
  AERIE_CHECK(base_lr >= 0, "lr schedule: negative learning rate " << base_lr);
  AERIE_CHECK(warmup_ratio >= 0 && warmup_ratio <= 1, "lr schedule: warmup ratio " << warmup_ratio << " not in [0, 1]");
  LrSchedule s;
  s.base_lr = base_lr;
  s.total_steps = total_steps;
  // int(total * ratio) as SpecForge; the product is rounded first so that 200 * 0.015 gives 3, not 2.
  s.warmup_steps = static_cast<int64_t>(std::floor(static_cast<double>(total_steps) * warmup_ratio + 1e-9));
  return s;
}

double LrSchedule::at(int64_t step) const {
  const int64_t n = step + 1;
  if (n > total_steps) return 0.0;
  if (n <= warmup_steps) return base_lr * static_cast<double>(n) / static_cast<double>(warmup_steps);
  const double progress =
      static_cast<double>(n - warmup_steps) / static_cast<double>(std::max<int64_t>(1, total_steps - warmup_steps));
  return base_lr * 0.5 * (1.0 + std::cos(std::numbers::pi * progress));
}

double clip_grad_norm(const std::vector<Tensor*>& grads, double max_norm) {
  double ss = 0;
  for (const Tensor* g : grads) ss += sum_squares(*g);
  const double norm = std::sqrt(ss);
  if (max_norm > 0) {
    const double coef = max_norm / (norm + 1e-6);  // torch: clip_coef, clamped to 1
    if (coef < 1.0)
      for (Tensor* g : grads) scale_inplace(*g, static_cast<float>(coef));
  }
  return norm;
}

}  // namespace aerie
