// CPU references of the fused forward ops: the loops of cpu/norm.cc (rmsnorm_forward), cpu/rope.cc
// (rope_apply), cpu/activation.cc (swiglu_forward) and add_inplace, in the same order of operations, so
// that a fused op gives the unfused sequence's fp32 bits.
#include "kernels/cpu/fused.h"

#include <cmath>
#include <cstring>
#include <vector>

namespace aerie::cpu {
namespace {

/// x (d) = w (x rs) in place, rs from the sequential fp32 sum of squares (cpu::rmsnorm_forward).
void rmsnorm_row(float* x, const float* w, float eps, int64_t d) {
  float ss = 0.0f;
  for (int64_t j = 0; j < d; ++j) ss += x[j] * x[j];
  const float rs = 1.0f / std::sqrt(ss / static_cast<float>(d) + eps);
  for (int64_t j = 0; j < d; ++j) x[j] = w[j] * (x[j] * rs);
}

void rope_row(float* x, const float* cs, const float* sn, int64_t half) {
  for (int64_t i = 0; i < half; ++i) {
    const float a = x[i], b = x[i + half];
    x[i] = a * cs[i] - b * sn[i];
    x[i + half] = b * cs[i] + a * sn[i];
  }
}

}  // namespace

void qkv_rope_forward(const float* qkv, const int32_t* positions, const float* inv_freq, const float* q_norm,
                      const float* k_norm, float eps, int64_t n, int64_t nq, int64_t nkv, int64_t d, float* q,
                      float* k, float* v) {
  const int64_t half = d / 2, width = (nq + 2 * nkv) * d;
  std::vector<float> cs(static_cast<size_t>(half)), sn(static_cast<size_t>(half));
  for (int64_t t = 0; t < n; ++t) {
    const float pos = static_cast<float>(positions[t]);
    for (int64_t i = 0; i < half; ++i) {
      const float ang = pos * inv_freq[i];
      cs[i] = std::cos(ang);
      sn[i] = std::sin(ang);
    }
    const float* row = qkv + t * width;
    float* qr = q + t * nq * d;
    float* kr = k + t * nkv * d;
    std::memcpy(qr, row, sizeof(float) * nq * d);
    std::memcpy(kr, row + nq * d, sizeof(float) * nkv * d);
    std::memcpy(v + t * nkv * d, row + (nq + nkv) * d, sizeof(float) * nkv * d);
    for (int64_t h = 0; h < nq; ++h) {
      if (q_norm) rmsnorm_row(qr + h * d, q_norm, eps, d);
      rope_row(qr + h * d, cs.data(), sn.data(), half);
    }
    for (int64_t h = 0; h < nkv; ++h) {
      if (k_norm) rmsnorm_row(kr + h * d, k_norm, eps, d);
      rope_row(kr + h * d, cs.data(), sn.data(), half);
    }
  }
}

void swiglu_packed_forward(const float* gu, int64_t n, int64_t i, float* out) {
  for (int64_t t = 0; t < n; ++t) {
    const float* g = gu + t * 2 * i;
    const float* u = g + i;
    float* o = out + t * i;
    for (int64_t j = 0; j < i; ++j) o[j] = g[j] * (1.0f / (1.0f + std::exp(-g[j]))) * u[j];
  }
}

void add_rmsnorm_forward(float* r, const float* x, const float* w, float eps, int64_t n, int64_t h, float* y) {
  for (int64_t t = 0; t < n; ++t) {
    float* rr = r + t * h;
    const float* xr = x + t * h;
    float* yr = y + t * h;
    float ss = 0.0f;
    for (int64_t j = 0; j < h; ++j) rr[j] += xr[j];
    for (int64_t j = 0; j < h; ++j) ss += rr[j] * rr[j];
    const float rs = 1.0f / std::sqrt(ss / static_cast<float>(h) + eps);
    for (int64_t j = 0; j < h; ++j) yr[j] = w[j] * (rr[j] * rs);
  }
}

}  // namespace aerie::cpu
