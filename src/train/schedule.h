// The learning-rate schedule and gradient clipping of draft training (eagle3.md section 4 defaults:
// linear warmup over 1.5% of the steps, then cosine to 0; clipping at global norm 0.5).
// Sources: SpecForge's CosineAnnealingWarmupLR (specforge/lr_scheduler.py) and torch.nn.utils.clip_grad_norm_.
#pragma once
#include <cstdint>
#include <vector>

#include "core/tensor.h"

namespace aerie {

/// Linear warmup then cosine decay to 0, as SpecForge's CosineAnnealingWarmupLR with eta_min = 0.
/// Update number n = step + 1 (1..total_steps):
///   n <= W:  lr = base * n / W
///   else:    lr = base * 0.5 * (1 + cos(pi * (n - W) / max(1, total - W)))
/// so the last update (n = total) uses lr exactly 0. W = floor(total * warmup_ratio).
struct LrSchedule {
  double base_lr = 1e-4;
  int64_t total_steps = 1;
  int64_t warmup_steps = 0;

  /// Throws aerie::Error if total_steps < 1, base_lr < 0 or warmup_ratio is outside [0, 1].
  static LrSchedule make(double base_lr, int64_t total_steps, double warmup_ratio);
  /// The lr of the update made at 0-based `step` (0 <= step < total_steps; later steps give 0).
  double at(int64_t step) const;
};

/// torch.nn.utils.clip_grad_norm_ over all `grads` (F32): norm = sqrt(sum of squares) (accumulated in
/// double); when c = max_norm / (norm + 1e-6) < 1, every gradient is scaled by c (torch's clip_coef).
/// max_norm <= 0 disables clipping. Returns the norm before clipping.
double clip_grad_norm(const std::vector<Tensor*>& grads, double max_norm);

}  // namespace aerie
