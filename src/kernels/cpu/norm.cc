// CPU RMSNorm, forward and backward, fp32 (Hugging Face LlamaRMSNorm: w * (x * rsqrt(mean(x^2) + eps))).
#include <cmath>

#include "kernels/cpu/cpu_kernels.h"

namespace aerie::cpu {

void rmsnorm_forward(const float* x, const float* w, float eps, int64_t n, int64_t h, float* y, float* rstd) {
  for (int64_t r = 0; r < n; ++r) {
    const float* xr = x + r * h;
    float* yr = y + r * h;
    float ss = 0.0f;
    for (int64_t j = 0; j < h; ++j) ss += xr[j] * xr[j];
    const float rs = 1.0f / std::sqrt(ss / static_cast<float>(h) + eps);
    for (int64_t j = 0; j < h; ++j) yr[j] = w[j] * (xr[j] * rs);
    if (rstd) rstd[r] = rs;
  }
}

// y_j = w_j x_j r with r = (mean(x^2) + eps)^(-1/2), dr/dx_i = -r^3 x_i / H, so
// dx_i = r w_i dy_i - (r^3 / H) x_i sum_j dy_j w_j x_j and dw_j = sum_rows dy_j x_j r.
void rmsnorm_backward(const float* dy, const float* x, const float* w, const float* rstd, int64_t n, int64_t h,
                      float* dx, float* dw) {
  for (int64_t r = 0; r < n; ++r) {
    const float* dyr = dy + r * h;
    const float* xr = x + r * h;
    float* dxr = dx + r * h;
    const float rs = rstd[r];
    float dot = 0.0f;
    for (int64_t j = 0; j < h; ++j) dot += dyr[j] * w[j] * xr[j];
    const float c = rs * rs * rs * dot / static_cast<float>(h);
    if (dw)  // before dx, so that dx may alias dy or x
      for (int64_t j = 0; j < h; ++j) dw[j] += dyr[j] * xr[j] * rs;
    for (int64_t j = 0; j < h; ++j) dxr[j] = rs * w[j] * dyr[j] - c * xr[j];
  }
}

}  // namespace aerie::cpu
