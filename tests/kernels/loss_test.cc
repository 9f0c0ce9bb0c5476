// Soft-target cross-entropy against a double reference and finite differences; softmax and argmax rows.
#include "kernels/loss.h"

#include <cmath>

#include "kernel_test_util.h"

namespace aerie {
namespace {

using testing::random_tensor;

/// Random target rows summing to 1, one entry of row 0 exactly 0.
Tensor random_target(int64_t n, int64_t k, uint32_t seed) {
  Tensor t = random_tensor({n, k}, seed, 0.0f, 1.0f);
  float* p = t.data<float>();
  p[1] = 0.0f;
  for (int64_t r = 0; r < n; ++r) {
    double s = 0.0;
    for (int64_t i = 0; i < k; ++i) s += p[r * k + i];
    for (int64_t i = 0; i < k; ++i) p[r * k + i] = float(p[r * k + i] / s);
  }
  return t;
}

TEST(SoftCrossEntropy, MatchesDoubleReference) {
  const int64_t n = 3, k = 11;
  Tensor z = random_tensor({n, k}, 1, -5.0f, 5.0f), q = random_target(n, k, 2);
  Tensor w = Tensor::from_vector<float>({1.0f, 0.0f, 2.5f}, {n});
  Tensor dz = random_tensor({n, k}, 3);  // overwritten
  const double got = soft_cross_entropy(z, q, w, &dz);
  const auto zv = z.to_float_vector(), qv = q.to_float_vector(), wv = w.to_float_vector();
  double ref = 0.0;
  std::vector<float> dref(n * k);
  for (int64_t r = 0; r < n; ++r) {
    double s = 0.0;
    for (int64_t i = 0; i < k; ++i) s += std::exp(double(zv[r * k + i]));
    const double lse = std::log(s);
    double ce = 0.0;
    for (int64_t i = 0; i < k; ++i) {
      ce -= qv[r * k + i] * (zv[r * k + i] - lse);
      dref[r * k + i] = float(wv[r] * (std::exp(zv[r * k + i] - lse) - qv[r * k + i]));
    }
    ref += wv[r] * ce;
  }
  EXPECT_NEAR(got, ref, 1e-9 * std::fabs(ref));
  testing::expect_close(dz.to_float_vector(), dref, 1e-7f, 1e-6f, "dlogits");
  for (int64_t i = 0; i < k; ++i) EXPECT_EQ(dz.data<float>()[k + i], 0.0f) << "row of weight 0";
  EXPECT_EQ(soft_cross_entropy(z, q, w, nullptr), got);
}

TEST(SoftCrossEntropy, GradientMatchesFiniteDifferences) {
  const int64_t n = 2, k = 6;
  Tensor z = random_tensor({n, k}, 4, -3.0f, 3.0f), q = random_target(n, k, 5);
  Tensor w = Tensor::from_vector<float>({0.7f, 1.3f}, {n});
  const auto gz = testing::numeric_grad(z, [&] { return soft_cross_entropy(z, q, w, nullptr); });
  Tensor dz = Tensor::empty({n, k}, DType::F32);
  soft_cross_entropy(z, q, w, &dz);
  testing::expect_close(dz.to_float_vector(), gz, testing::kFdAtol, testing::kFdRtol, "dlogits");
}

TEST(SoftCrossEntropy, ErrorsNameTheTensor) {
  Tensor z = random_tensor({2, 4}, 1), q = random_tensor({2, 5}, 2), w = random_tensor({2}, 3);
  testing::expect_error([&] { soft_cross_entropy(z, q, w, nullptr); }, "soft_cross_entropy: target");
  Tensor q4 = random_tensor({2, 4}, 2), w3 = random_tensor({3}, 3);
  testing::expect_error([&] { soft_cross_entropy(z, q4, w3, nullptr); }, "soft_cross_entropy: weight");
  Tensor dz = Tensor::empty({4, 2}, DType::F32);
  testing::expect_error([&] { soft_cross_entropy(z, q4, w, &dz); }, "soft_cross_entropy: dlogits");
}

TEST(SoftmaxRows, SumsToOneAndMayAlias) {
  Tensor x = Tensor::from_vector<float>({1, 2, 3, 1000, 1000, -1000}, {2, 3});
  Tensor y = Tensor::empty({2, 3}, DType::F32);
  softmax_rows(x, y);
  const double e1 = std::exp(1.0), e2 = std::exp(2.0), e3 = std::exp(3.0), s = e1 + e2 + e3;
  testing::expect_close(y.to_float_vector(), {float(e1 / s), float(e2 / s), float(e3 / s), 0.5f, 0.5f, 0.0f},
                        1e-7f, 1e-6f, "softmax");
  softmax_rows(x, x);  // in place
  EXPECT_EQ(x.to_float_vector(), y.to_float_vector());
}

TEST(ArgmaxRows, TiesTakeTheSmallerIndex) {
  Tensor x = Tensor::from_vector<float>({0, 3, 3, 1, -1, -2, -1, -5, 7, 0, 0, 7}, {3, 4});
  EXPECT_EQ(argmax_rows(x), (std::vector<int64_t>{1, 0, 0}));
}

}  // namespace
}  // namespace aerie
