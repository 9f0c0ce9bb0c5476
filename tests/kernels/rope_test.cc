// RoPE: inv_freq ("default", "llama3") against transformers' formulas evaluated in double; the rotation
// against the rotate_half formula in double; the inverse as the backward via finite differences.
#include "kernels/rope.h"

#include <cmath>
#include <numbers>

#include "kernel_test_util.h"

namespace aerie {
namespace {

using testing::random_tensor;

TEST(Rope, DefaultInvFreq) {
  RopeParams p;
  p.theta = 10000.0;
  const auto inv = rope_inv_freq(p, 64);
  ASSERT_EQ(inv.size(), 32u);
  std::vector<float> ref(32);
  for (int i = 0; i < 32; ++i) ref[i] = float(1.0 / std::pow(10000.0, 2.0 * i / 64.0));
  EXPECT_EQ(inv[0], 1.0f);
  // fp32 pow and reciprocal as PyTorch does them: a few ulp from the double value
  testing::expect_close(inv, ref, 0.0f, 1e-6f, "inv_freq");
}

// transformers _compute_llama3_parameters in double, Llama 3.1's rope_scaling.
TEST(Rope, Llama3InvFreqMatchesTransformersFormula) {
  RopeParams p;
  p.theta = 500000.0;
  p.type = "llama3";
  p.factor = 8.0;
  p.low_freq_factor = 1.0;
  p.high_freq_factor = 4.0;
  p.original_max_position_embeddings = 8192;
  const int64_t d = 128;
  const auto inv = rope_inv_freq(p, d);
  ASSERT_EQ(inv.size(), 64u);
  std::vector<float> ref(64);
  int low = 0, mid = 0, high = 0;
  for (int i = 0; i < 64; ++i) {
    const double f = 1.0 / std::pow(500000.0, 2.0 * i / double(d));
    const double wavelen = 2 * std::numbers::pi / f;
    double out;
    if (wavelen < 8192.0 / 4.0) {
      out = f;  // high frequency: unchanged
      ++high;
    } else if (wavelen > 8192.0 / 1.0) {
      out = f / 8.0;  // low frequency: divided by factor
      ++low;
    } else {  // smooth interpolation
      const double s = (8192.0 / wavelen - 1.0) / (4.0 - 1.0);
      out = (1 - s) * f / 8.0 + s * f;
      ++mid;
    }
    ref[i] = float(out);
  }
  EXPECT_GT(low, 0);
  EXPECT_GT(mid, 0);
  EXPECT_GT(high, 0);
  // fp32 evaluation of the same ops (see src/kernels/cpu/rope.cc): a few ulp, up to ~1e-5 relative in the
  // smooth region where 8192 / wavelen - 1 cancels
  testing::expect_close(inv, ref, 0.0f, 2e-5f, "inv_freq");
}

TEST(Rope, ApplyMatchesRotateHalf) {
  const int64_t t = 4, nh = 3, d = 8;
  const auto inv = rope_inv_freq(RopeParams{}, d);
  Tensor x = random_tensor({t, nh, d}, 1);
  Tensor pos = Tensor::from_vector<int32_t>({0, 7, 3, 45}, {t});
  const auto xv = x.to_float_vector();
  std::vector<float> ref(xv.size());
  const int32_t pv[] = {0, 7, 3, 45};
  for (int64_t r = 0; r < t; ++r)
    for (int64_t h = 0; h < nh; ++h)
      for (int64_t i = 0; i < d / 2; ++i) {
        const double ang = float(float(pv[r]) * inv[i]);  // the fp32 angle, as HF computes it
        const int64_t b = (r * nh + h) * d;
        ref[b + i] = float(xv[b + i] * std::cos(ang) - xv[b + i + d / 2] * std::sin(ang));
        ref[b + i + d / 2] = float(xv[b + i + d / 2] * std::cos(ang) + xv[b + i] * std::sin(ang));
      }
  Tensor y = x.clone();
  rope_apply(y, pos, inv);
  testing::expect_close(y.to_float_vector(), ref, 1e-6f, 1e-6f, "y");
  rope_apply(y, pos, inv, /*inverse=*/true);
  testing::expect_close(y.to_float_vector(), xv, 1e-6f, 0.0f, "inverse(forward(x))");
}

TEST(Rope, InverseIsTheBackward) {
  const int64_t t = 3, nh = 2, d = 6;
  RopeParams p;
  p.theta = 100.0;
  const auto inv = rope_inv_freq(p, d);
  Tensor x = random_tensor({t, nh, d}, 2), r = random_tensor({t, nh, d}, 3);
  Tensor pos = Tensor::from_vector<int32_t>({2, 9, 30}, {t});
  auto loss = [&] {
    Tensor y = x.clone();
    rope_apply(y, pos, inv);
    return testing::dot_double(y, r);
  };
  const auto gx = testing::numeric_grad(x, loss);
  Tensor dx = r.clone();
  rope_apply(dx, pos, inv, /*inverse=*/true);
  testing::expect_close(dx.to_float_vector(), gx, testing::kFdAtol, testing::kFdRtol, "dx");
}

TEST(Rope, Errors) {
  testing::expect_error([] { rope_inv_freq(RopeParams{}, 7); }, "even");
  RopeParams bad;
  bad.type = "dynamic";  // not implemented
  testing::expect_error([&] { rope_inv_freq(bad, 8); }, "dynamic");
  Tensor x = random_tensor({2, 1, 8}, 1);
  Tensor pos = Tensor::from_vector<int32_t>({0, 1}, {2});
  testing::expect_error([&] { rope_apply(x, pos, std::vector<float>(3, 1.0f)); }, "inv_freq");
  Tensor pos_bad = Tensor::from_vector<int32_t>({0, 1, 2}, {3});
  testing::expect_error([&] { rope_apply(x, pos_bad, rope_inv_freq(RopeParams{}, 8)); }, "rope_apply: positions");
}

// transformers _compute_linear_scaling_rope_parameters: the default inv_freq divided by factor.
TEST(Rope, LinearInvFreqIsDefaultOverFactor) {
  RopeParams p;
  p.theta = 10000.0;
  const auto def = rope_inv_freq(p, 64);
  p.type = "linear";
  p.factor = 4.0;
  const auto lin = rope_inv_freq(p, 64);
  ASSERT_EQ(lin.size(), def.size());
  for (size_t i = 0; i < def.size(); ++i) EXPECT_EQ(lin[i], def[i] / 4.0f) << i;
  p.factor = 0.0;
  testing::expect_error([&] { rope_inv_freq(p, 64); }, "factor");
}

TEST(Rope, Bf16RotatesInFp32AndRounds) {
  const auto inv = rope_inv_freq(RopeParams{}, 8);
  Tensor x = random_tensor({3, 2, 8}, 4).to(DType::BF16);
  Tensor pos = Tensor::from_vector<int32_t>({5, 0, 99}, {3});
  Tensor ref = x.to(DType::F32);
  rope_apply(ref, pos, inv);
  rope_apply(x, pos, inv);
  EXPECT_EQ(x.dtype(), DType::BF16);
  EXPECT_EQ(x.to_float_vector(), ref.to(DType::BF16).to_float_vector());
}

}  // namespace
}  // namespace aerie
