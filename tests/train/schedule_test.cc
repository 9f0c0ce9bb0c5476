// LR schedule (warmup + cosine to 0, SpecForge's CosineAnnealingWarmupLR) and gradient clipping.
#include <cmath>
#include <numbers>

#include "test_util.h"
#include "train/schedule.h"

namespace aerie {
namespace {

TEST(LrScheduleTest, WarmupIsLinearAndCosineEndsAtZero) {
  LrSchedule s = LrSchedule::make(1e-4, 200, 0.015);
  ASSERT_EQ(s.warmup_steps, 3);  // int(200 * 0.015)
  // Warmup: update n = step + 1 gets base * n / W.
  EXPECT_DOUBLE_EQ(s.at(0), 1e-4 / 3);
  EXPECT_DOUBLE_EQ(s.at(1), 2e-4 / 3);
  EXPECT_DOUBLE_EQ(s.at(2), 1e-4);
  // Cosine from the peak: update n = W + (total - W) / 2 is half way.
  const int64_t W = 3, T = 200;
  for (int64_t step = 3; step < T; ++step) {
    double progress = static_cast<double>(step + 1 - W) / static_cast<double>(T - W);
    double want = 1e-4 * 0.5 * (1 + std::cos(std::numbers::pi * progress));
    EXPECT_NEAR(s.at(step), want, 1e-18) << step;
    EXPECT_LT(s.at(step), s.at(step - 1)) << "not decreasing at " << step;
  }
  EXPECT_EQ(s.at(T - 1), 0.0);  // the last update: cosine ends exactly at 0
  EXPECT_EQ(s.at(T), 0.0);
}

TEST(LrScheduleTest, NoWarmupAndSingleStep) {
  LrSchedule s = LrSchedule::make(2e-4, 10, 0.0);
  EXPECT_EQ(s.warmup_steps, 0);
  EXPECT_NEAR(s.at(0), 2e-4 * 0.5 * (1 + std::cos(std::numbers::pi * 0.1)), 1e-18);
  LrSchedule one = LrSchedule::make(2e-4, 1, 0.015);
  EXPECT_EQ(one.at(0), 0.0);
  LrSchedule warm = LrSchedule::make(2e-4, 4, 0.5);
  EXPECT_EQ(warm.warmup_steps, 2);
  EXPECT_DOUBLE_EQ(warm.at(1), 2e-4);  // the peak is reached at the last warmup update
  EXPECT_THROW(LrSchedule::make(1e-4, 0, 0.1), Error);
  EXPECT_THROW(LrSchedule::make(1e-4, 10, 1.5), Error);
}

TEST(ClipGradNormTest, ScalesToMaxNormAboveItOnly) {
  Tensor a = Tensor::from_vector<float>({3.0f, 0.0f}, {2});
  Tensor b = Tensor::from_vector<float>({4.0f}, {1});
  std::vector<Tensor*> g = {&a, &b};
  double norm = clip_grad_norm(g, 0.5);
  EXPECT_DOUBLE_EQ(norm, 5.0);
  const float c = static_cast<float>(0.5 / (5.0 + 1e-6));
  EXPECT_EQ(a.data<float>()[0], 3.0f * c);
  EXPECT_EQ(b.data<float>()[0], 4.0f * c);
  double after = std::sqrt(static_cast<double>(a.data<float>()[0]) * a.data<float>()[0] +
                           static_cast<double>(b.data<float>()[0]) * b.data<float>()[0]);
  EXPECT_NEAR(after, 0.5, 1e-6);
  // Below the threshold: untouched.
  Tensor x = Tensor::from_vector<float>({0.1f, -0.2f}, {2});
  std::vector<Tensor*> gx = {&x};
  EXPECT_NEAR(clip_grad_norm(gx, 0.5), std::sqrt(0.05), 1e-7);
  EXPECT_EQ(x.data<float>()[0], 0.1f);
  EXPECT_EQ(x.data<float>()[1], -0.2f);
  // max_norm <= 0: no clipping.
  Tensor y = Tensor::from_vector<float>({30.0f}, {1});
  std::vector<Tensor*> gy = {&y};
  EXPECT_DOUBLE_EQ(clip_grad_norm(gy, 0.0), 30.0);
  EXPECT_EQ(y.data<float>()[0], 30.0f);
}

}  // namespace
}  // namespace aerie
