// Helpers of the kernel tests: seeded random tensors, central finite differences, error-message checks.
#pragma once
#include <gtest/gtest.h>

#include <functional>
#include <random>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "test_util.h"

namespace aerie::testing {

/// F32 tensor of the given shape with values uniform in [lo, hi), seeded (deterministic).
inline Tensor random_tensor(const Shape& shape, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  Tensor t = Tensor::empty(shape, DType::F32);
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = dist(gen);
  return t;
}

/// sum_i a_i b_i in double (the scalar "loss" L = <out, R> whose gradient wrt out is R).
inline double dot_double(const Tensor& a, const Tensor& b) {
  const auto av = a.to_float_vector(), bv = b.to_float_vector();
  double s = 0.0;
  for (size_t i = 0; i < av.size(); ++i) s += static_cast<double>(av[i]) * bv[i];
  return s;
}

/// Central differences dL/dx_i ~ (L(x + h e_i) - L(x - h e_i)) / 2h for every element of the F32 tensor x,
/// perturbed in place and restored. Error: O(h^2) truncation plus ~1e-7 |L| / h fp32 rounding.
inline std::vector<float> numeric_grad(Tensor& x, const std::function<double()>& loss, float h = 1e-2f) {
  std::vector<float> g(static_cast<size_t>(x.numel()));
  float* p = x.data<float>();
  for (int64_t i = 0; i < x.numel(); ++i) {
    const float orig = p[i];
    p[i] = orig + h;
    const double lp = loss();
    p[i] = orig - h;
    const double lm = loss();
    p[i] = orig;
    g[i] = static_cast<float>((lp - lm) / (2.0 * static_cast<double>(h)));
  }
  return g;
}

/// EXPECTs that fn throws aerie::Error whose message contains `needle` (e.g. the tensor's name).
inline void expect_error(const std::function<void()>& fn, const std::string& needle) {
  try {
    fn();
    ADD_FAILURE() << "no aerie::Error thrown (expected one mentioning '" << needle << "')";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos)
        << "message '" << e.what() << "' does not mention '" << needle << "'";
  }
}

/// Tolerance of the finite-difference checks (fp32 forward, h = 1e-2, O(1) values, L = <out, R>):
/// rounding ~1e-7 * |L| / h ~ 1e-4 plus truncation h^2 |f'''| ~ 1e-4, so atol 2e-3 and rtol 1e-2 are
/// several times the expected error while a wrong term (a missing factor or sign) is O(1).
constexpr float kFdAtol = 2e-3f, kFdRtol = 1e-2f;

}  // namespace aerie::testing
