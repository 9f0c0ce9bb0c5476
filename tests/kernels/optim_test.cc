// AdamW against a two-step torch.optim.AdamW sequence computed by hand (in double), and the helpers.
#include "kernels/optim.h"

#include <cmath>

#include "kernel_test_util.h"

namespace aerie {
namespace {

TEST(AdamW, TwoStepsMatchTorchFormula) {
  AdamWParams hp;
  hp.lr = 1e-2f;
  hp.beta1 = 0.9f;
  hp.beta2 = 0.95f;
  hp.eps = 1e-8f;
  hp.weight_decay = 0.1f;
  const std::vector<std::vector<float>> grads = {{0.1f, -0.2f, 0.3f, 0.0f}, {-0.05f, 0.4f, 0.3f, 1.0f}};
  Tensor p = Tensor::from_vector<float>({0.5f, -1.0f, 2.0f, 0.0f}, {2, 2});
  Tensor m = Tensor::zeros({2, 2}, DType::F32), v = Tensor::zeros({2, 2}, DType::F32);
  // torch.optim.AdamW (_single_tensor_adam, decoupled decay) in double:
  //   p *= 1 - lr wd; m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2;
  //   p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
  std::vector<double> pd = {0.5, -1.0, 2.0, 0.0}, md(4, 0.0), vd(4, 0.0);
  const double lr = 1e-2, b1 = 0.9, b2 = 0.95, eps = 1e-8, wd = 0.1;
  for (int t = 1; t <= 2; ++t) {
    Tensor g = Tensor::from_vector(grads[t - 1], {2, 2});
    adamw_step(p, g, m, v, hp, t);
    for (int i = 0; i < 4; ++i) {
      const double gi = grads[t - 1][i];
      pd[i] *= 1 - lr * wd;
      md[i] = b1 * md[i] + (1 - b1) * gi;
      vd[i] = b2 * vd[i] + (1 - b2) * gi * gi;
      pd[i] -= lr / (1 - std::pow(b1, t)) * md[i] / (std::sqrt(vd[i]) / std::sqrt(1 - std::pow(b2, t)) + eps);
    }
    std::vector<float> pref(pd.begin(), pd.end()), mref(md.begin(), md.end()), vref(vd.begin(), vd.end());
    // fp32 arithmetic of O(1) values over two steps: a few ulp
    testing::expect_close(p.to_float_vector(), pref, 1e-6f, 1e-6f, "param step " + std::to_string(t));
    testing::expect_close(m.to_float_vector(), mref, 1e-8f, 1e-6f, "m step " + std::to_string(t));
    testing::expect_close(v.to_float_vector(), vref, 1e-10f, 1e-6f, "v step " + std::to_string(t));
  }
  // The same numbers written out (Python floats, same formula), so a wrong formula above cannot hide.
  testing::expect_close(p.to_float_vector(), {0.4863268068602668f, -0.9916447398902383f, 1.9760120006663333f,
                                              -0.007349599920404706f},
                        1e-6f, 1e-6f, "param after two steps");
}

TEST(AdamW, ErrorsNameTheTensor) {
  Tensor p = Tensor::zeros({3}, DType::F32), g = Tensor::zeros({4}, DType::F32);
  Tensor m = Tensor::zeros({3}, DType::F32), v = Tensor::zeros({3}, DType::F32);
  testing::expect_error([&] { adamw_step(p, g, m, v, AdamWParams{}, 1); }, "adamw_step: grad");
  testing::expect_error([&] { adamw_step(p, m, m, v, AdamWParams{}, 0); }, "step counts from 1");
}

TEST(GradHelpers, SumSquaresScaleAdd) {
  Tensor x = Tensor::from_vector<float>({1, -2, 3}, {3});
  EXPECT_EQ(sum_squares(x), 14.0);
  scale_inplace(x, 0.5f);
  EXPECT_EQ(x.to_float_vector(), (std::vector<float>{0.5f, -1, 1.5f}));
  Tensor y = Tensor::from_vector<float>({1, 1, 1}, {1, 3});
  add_inplace(y, x);
  EXPECT_EQ(y.to_float_vector(), (std::vector<float>{1.5f, 0, 2.5f}));
  Tensor z = Tensor::zeros({2}, DType::F32);
  testing::expect_error([&] { add_inplace(z, x); }, "numel");
}

// adamw_step_clipped on the CPU is exactly train/schedule.cc's clip_grad_norm (sum_squares, then
// scale_inplace when the clip factor is < 1) followed by adamw_step on every tensor.
TEST(AdamWClipped, EqualsComposedOps) {
  const std::vector<int64_t> sizes = {37, 1, 0, 500, 64};
  AdamWParams hp;
  hp.lr = 1e-2f;
  hp.weight_decay = 0.05f;
  for (double max_norm : {0.5, 1e6, 0.0}) {  // clip active, inactive, disabled
    std::vector<Tensor> p, m, v, p2, m2, v2;
    for (size_t i = 0; i < sizes.size(); ++i) {
      p.push_back(testing::random_tensor({sizes[i]}, 10 + i));
      m.push_back(Tensor::zeros({sizes[i]}, DType::F32));
      v.push_back(Tensor::zeros({sizes[i]}, DType::F32));
      p2.push_back(p.back().clone());
      m2.push_back(m.back().clone());
      v2.push_back(v.back().clone());
    }
    for (int step = 1; step <= 3; ++step) {
      std::vector<Tensor> g, g2;
      for (size_t i = 0; i < sizes.size(); ++i) {
        g.push_back(testing::random_tensor({sizes[i]}, 20 + 10 * step + i, -0.5f, 0.5f));
        g2.push_back(g.back().clone());
      }
      double ss = 0;
      for (auto& t : g) ss += sum_squares(t);
      const double norm = std::sqrt(ss);
      const bool clips = max_norm > 0 && max_norm / (norm + 1e-6) < 1.0;
      if (clips)
        for (auto& t : g) scale_inplace(t, static_cast<float>(max_norm / (norm + 1e-6)));
      for (size_t i = 0; i < sizes.size(); ++i) adamw_step(p[i], g[i], m[i], v[i], hp, step);

      std::vector<Tensor*> ps, ms, vs;
      std::vector<const Tensor*> gs;
      for (size_t i = 0; i < sizes.size(); ++i) {
        ps.push_back(&p2[i]);
        gs.push_back(&g2[i]);
        ms.push_back(&m2[i]);
        vs.push_back(&v2[i]);
      }
      const std::vector<float> g0 = g2[0].to_float_vector();
      EXPECT_EQ(adamw_step_clipped(ps, gs, ms, vs, hp, step, max_norm), norm);
      EXPECT_EQ(clips, max_norm == 0.5) << "norm " << norm;
      EXPECT_EQ(g2[0].to_float_vector(), g0) << "gradients are left unchanged";
      for (size_t i = 0; i < sizes.size(); ++i) {
        EXPECT_EQ(p2[i].to_float_vector(), p[i].to_float_vector()) << "param " << i << " step " << step;
        EXPECT_EQ(m2[i].to_float_vector(), m[i].to_float_vector()) << "m " << i << " step " << step;
        EXPECT_EQ(v2[i].to_float_vector(), v[i].to_float_vector()) << "v " << i << " step " << step;
      }
    }
  }
}

TEST(AdamWClipped, ErrorsNameTheTensor) {
  Tensor p = Tensor::zeros({3}, DType::F32), g = Tensor::zeros({3}, DType::F32), g4 = Tensor::zeros({4}, DType::F32);
  Tensor m = Tensor::zeros({3}, DType::F32), v = Tensor::zeros({3}, DType::F32);
  Tensor p2 = Tensor::zeros({4}, DType::F32), m2 = Tensor::zeros({4}, DType::F32), v2 = Tensor::zeros({4}, DType::F32);
  testing::expect_error([&] { adamw_step_clipped({&p, &p2}, {&g, &g}, {&m, &m2}, {&v, &v2}, AdamWParams{}, 1, 1.0); },
                        "adamw_step_clipped: grads[1]");
  testing::expect_error([&] { adamw_step_clipped({&p}, {&g4}, {&m}, {&v}, AdamWParams{}, 1, 1.0); },
                        "adamw_step_clipped: grads[0]");
  testing::expect_error([&] { adamw_step_clipped({&p}, {}, {&m}, {&v}, AdamWParams{}, 1, 1.0); }, "0 grads");
  testing::expect_error([&] { adamw_step_clipped({&p}, {&g}, {&m}, {&v}, AdamWParams{}, 0, 1.0); },
                        "step counts from 1");
  EXPECT_EQ(adamw_step_clipped({}, {}, {}, {}, AdamWParams{}, 1, 1.0), 0.0);
}

TEST(GradHelpers, Bf16IsWidenedAndRounded) {
  Tensor x = Tensor::from_vector<float>({1, -2, 3}, {3}).to(DType::BF16);
  EXPECT_EQ(sum_squares(x), 14.0);
  scale_inplace(x, 1.0f / 3.0f);
  EXPECT_EQ(x.to_float_vector(), (std::vector<float>{round_bf16(1.0f / 3.0f), round_bf16(-2.0f / 3.0f), 1.0f}));
  Tensor y = Tensor::from_vector<float>({0.25f, 0.5f, 1}, {3});  // F32 y += BF16 x
  add_inplace(y, x);
  EXPECT_EQ(y.to_float_vector(), (std::vector<float>{0.25f + round_bf16(1.0f / 3.0f),
                                                     0.5f + round_bf16(-2.0f / 3.0f), 2.0f}));
  Tensor yb = Tensor::from_vector<float>({1, 1, 1}, {3}).to(DType::BF16);  // BF16 y += BF16 x
  add_inplace(yb, x);
  EXPECT_EQ(yb.to_float_vector(), (std::vector<float>{round_bf16(1.0f + round_bf16(1.0f / 3.0f)),
                                                      round_bf16(1.0f + round_bf16(-2.0f / 3.0f)), 2.0f}));
  Tensor i32 = Tensor::zeros({3}, DType::I32);
  testing::expect_error([&] { sum_squares(i32); }, "sum_squares: x must be F32 or BF16");
}

}  // namespace
}  // namespace aerie
