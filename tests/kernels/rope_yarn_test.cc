// YaRN (DeepSeek-V3 / Kimi) inv_freq against transformers' _compute_yarn_parameters evaluated in double,
// the correction ranges and softmax scales of deepseek-v3.md section 4, and the interleaved rotation
// against the rotate_half rotation of the de-interleaved vector (what transformers' rope_interleave does).
#include <cmath>
#include <numbers>

#include "kernel_test_util.h"
#include "kernels/rope.h"

namespace aerie {
namespace {

RopeParams yarn(double theta, double factor, double beta_fast, double beta_slow) {
  RopeParams p;
  p.theta = theta;
  p.type = "yarn";
  p.factor = factor;
  p.original_max_position_embeddings = 4096;
  p.beta_fast = beta_fast;
  p.beta_slow = beta_slow;
  p.mscale = p.mscale_all_dim = 1.0;
  return p;
}

/// The pairs that keep base^(-2i/d) (i <= low) and those divided by factor (i >= high), per section 4.
void expect_ramp(const RopeParams& p, int low, int high, const std::string& what) {
  const int d = 64;
  const auto inv = rope_inv_freq(p, d);
  ASSERT_EQ(inv.size(), 32u);
  for (int i = 0; i < 32; ++i) {
    const double extra = 1.0 / std::pow(p.theta, 2.0 * i / d), interp = extra / p.factor;
    const double ramp = std::clamp((i - double(low)) / (double(high) - double(low)), 0.0, 1.0);
    const double want = interp * ramp + extra * (1.0 - ramp);
    EXPECT_NEAR(inv[i], want, 2e-6 * want) << what << " pair " << i;
    if (i <= low) {
      EXPECT_NEAR(inv[i], extra, 2e-6 * extra) << what << " pair " << i << " keeps the base frequency";
    }
    if (i >= high) {
      EXPECT_NEAR(inv[i], interp, 2e-6 * interp) << what << " pair " << i << " is divided by the factor";
    }
  }
}

TEST(RopeYarn, CorrectionRangesOfTheThreeModels) {
  expect_ramp(yarn(10000, 40, 32, 1), 10, 23, "DeepSeek-V3");
  expect_ramp(yarn(50000, 32, 1, 1), 19, 20, "Kimi-K2");  // a step: 19 keeps, 20 is divided
  expect_ramp(yarn(50000, 64, 32, 1), 8, 20, "Kimi-K2.5");
}

TEST(RopeYarn, SoftmaxScaleAndCosSinFactor) {
  // softmax scale = 192^-0.5 mscale(f, mscale_all_dim)^2 (DeepseekV3Attention.scaling).
  const double s = 1.0 / std::sqrt(192.0);
  EXPECT_NEAR(s * std::pow(yarn_mscale(40, 1.0), 2), 0.135234, 1e-6);
  EXPECT_NEAR(s * std::pow(yarn_mscale(32, 1.0), 2), 0.130861, 1e-6);
  EXPECT_NEAR(s * std::pow(yarn_mscale(64, 1.0), 2), 0.144680, 1e-6);
  EXPECT_EQ(rope_attention_factor(yarn(10000, 40, 32, 1)), 1.0);  // mscale == mscale_all_dim
  RopeParams generic = yarn(10000, 40, 32, 1);
  generic.mscale = generic.mscale_all_dim = 0.0;  // absent: the generic 0.1 ln f + 1
  EXPECT_NEAR(rope_attention_factor(generic), 0.1 * std::log(40.0) + 1.0, 1e-12);
  generic.attention_factor = 0.5;
  EXPECT_EQ(rope_attention_factor(generic), 0.5);
  EXPECT_EQ(rope_attention_factor(RopeParams{}), 1.0);
  EXPECT_EQ(yarn_mscale(1.0, 1.0), 1.0);
}

TEST(RopeYarn, InterleavedEqualsRotateHalfOfTheDeinterleavedVector) {
  const int64_t t = 5, nh = 3, d = 16;
  Tensor x = testing::random_tensor({t, nh, d}, 3, -2.0f, 2.0f);
  Tensor pos = Tensor::from_vector(std::vector<int32_t>{0, 1, 7, 100, 4095}, {t});
  const auto inv = rope_inv_freq(yarn(10000, 40, 32, 1), d);
  // De-interleave each head: [x0, x2, .., x1, x3, ..], rotate_half rope, re-interleave.
  Tensor de = Tensor::empty({t, nh, d}, DType::F32);
  const float* xs = x.data<float>();
  float* ds = de.data<float>();
  for (int64_t r = 0; r < t * nh; ++r)
    for (int64_t i = 0; i < d / 2; ++i) {
      ds[r * d + i] = xs[r * d + 2 * i];
      ds[r * d + d / 2 + i] = xs[r * d + 2 * i + 1];
    }
  rope_apply(de, pos, inv);
  rope_apply_interleaved(x, pos, inv, 0.5f);
  for (int64_t r = 0; r < t * nh; ++r)
    for (int64_t i = 0; i < d / 2; ++i) {
      EXPECT_FLOAT_EQ(x.data<float>()[r * d + 2 * i], 0.5f * ds[r * d + i]) << r << " " << i;
      EXPECT_FLOAT_EQ(x.data<float>()[r * d + 2 * i + 1], 0.5f * ds[r * d + d / 2 + i]) << r << " " << i;
    }
}

TEST(RopeYarn, Errors) {
  Tensor x = Tensor::zeros({2, 1, 8}, DType::F32);
  Tensor pos = Tensor::from_vector(std::vector<int32_t>{0, 1}, {2});
  EXPECT_THROW(rope_apply_interleaved(x, pos, std::vector<float>(3, 1.0f), 1.0f), Error);
  RopeParams bad = yarn(10000, 0, 32, 1);
  EXPECT_THROW(rope_inv_freq(bad, 64), Error);
}

}  // namespace
}  // namespace aerie
