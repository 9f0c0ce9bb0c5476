// CPU soft-target cross-entropy, softmax and argmax over rows.
#include <algorithm>
#include <cmath>
#include <limits>

#include "kernels/cpu/cpu_kernels.h"

namespace aerie::cpu {

// Per row (double): lse = m + log sum exp(z - m), CE = -sum_i q_i (z_i - lse) over q_i != 0 (so a zero
// target on a -inf logit adds nothing). dlogits = w (softmax(z) - q) in fp32; a row of weight 0 gets 0.
double soft_cross_entropy(const float* logits, const float* target, const float* weight, int64_t n, int64_t k,
                          float* dlogits) {
  double total = 0.0;
  for (int64_t r = 0; r < n; ++r) {
    const float* z = logits + r * k;
    const float* q = target + r * k;
    float* dz = dlogits ? dlogits + r * k : nullptr;
    const float w = weight[r];
    if (w == 0.0f) {
      if (dz)
        for (int64_t i = 0; i < k; ++i) dz[i] = 0.0f;
      continue;
    }
    double mx = -std::numeric_limits<double>::infinity();
    for (int64_t i = 0; i < k; ++i) mx = std::max(mx, static_cast<double>(z[i]));
    double sum = 0.0;
    for (int64_t i = 0; i < k; ++i) sum += std::exp(static_cast<double>(z[i]) - mx);
    const double lse = mx + std::log(sum);
    double ce = 0.0;
    for (int64_t i = 0; i < k; ++i)
      if (q[i] != 0.0f) ce -= static_cast<double>(q[i]) * (static_cast<double>(z[i]) - lse);
    total += static_cast<double>(w) * ce;
    if (dz)
      for (int64_t i = 0; i < k; ++i)
        dz[i] = w * (static_cast<float>(std::exp(static_cast<double>(z[i]) - lse)) - q[i]);
  }
  return total;
}

void softmax_rows(const float* x, float* y, int64_t n, int64_t k) {
  for (int64_t r = 0; r < n; ++r) {
    const float* xr = x + r * k;
    float* yr = y + r * k;
    float mx = -std::numeric_limits<float>::infinity();
    for (int64_t i = 0; i < k; ++i) mx = std::max(mx, xr[i]);
    float sum = 0.0f;
    for (int64_t i = 0; i < k; ++i) {
      yr[i] = std::exp(xr[i] - mx);
      sum += yr[i];
    }
    const float inv = 1.0f / sum;
    for (int64_t i = 0; i < k; ++i) yr[i] *= inv;
  }
}

void argmax_rows(const float* x, int64_t n, int64_t k, int64_t* out) {
  for (int64_t r = 0; r < n; ++r) {
    const float* xr = x + r * k;
    int64_t best = 0;
    for (int64_t i = 1; i < k; ++i)
      if (xr[i] > xr[best]) best = i;  // strict: ties keep the smaller index
    out[r] = best;
  }
}

// Exactly the steps make_ttt_sample took before the op existed (argmax_rows, gather, softmax_rows), so
// that its results stay bit-identical.
void target_rows(const float* logits, const int64_t* selected, int64_t n, int64_t v, int64_t k, float* probs,
                 int64_t* argmax) {
  argmax_rows(logits, n, v, argmax);
  for (int64_t r = 0; r < n; ++r) {
    const float* lr = logits + r * v;
    float* q = probs + r * k;
    for (int64_t i = 0; i < k; ++i) q[i] = lr[selected[i]];
  }
  softmax_rows(probs, probs, n, k);
}

}  // namespace aerie::cpu
