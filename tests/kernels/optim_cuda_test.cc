// AdamW, the fused clip + AdamW over many tensors, and the gradient-norm helpers on CUDA against the
// CPU reference (kernels/cpu/optim.cc). Skipped without a GPU.
#include <cmath>

#include "cuda_test_util.h"
#include "kernels/optim.h"

namespace aerie {
namespace {

using testing::gpu;
using testing::random_as;

AdamWParams hyper(float wd) {
  AdamWParams p;
  p.lr = 1e-3f;
  p.weight_decay = wd;
  return p;
}

TEST(OptimCuda, AdamWStepMatchesCpu) {
  AERIE_REQUIRE_CUDA();
  for (int64_t n : {1, 1000, 4097, 100003})
    for (float wd : {0.0f, 0.1f}) {
      Tensor p = testing::random_tensor({n}, 41), m = testing::random_tensor({n}, 42, -0.1f, 0.1f);
      Tensor v = testing::random_tensor({n}, 43, 0.0f, 0.01f);
      Tensor pg = gpu(p), mg = gpu(m), vg = gpu(v);
      for (int step = 1; step <= 3; ++step) {
        Tensor g = testing::random_tensor({n}, 44 + step);
        adamw_step(p, g, m, v, hyper(wd), step);
        adamw_step(pg, gpu(g), mg, vg, hyper(wd), step);
      }
      // The same fp32 ops without FMA contraction on both sides: equal up to sqrt/division rounding
      // (both correctly rounded), so a few ulp at most.
      const std::string what = "n " + std::to_string(n) + " wd " + std::to_string(wd);
      testing::expect_close(pg.to_float_vector(), p.to_float_vector(), 1e-7f, 1e-6f, "param " + what);
      testing::expect_close(mg.to_float_vector(), m.to_float_vector(), 1e-9f, 1e-6f, "m " + what);
      testing::expect_close(vg.to_float_vector(), v.to_float_vector(), 1e-12f, 1e-6f, "v " + what);
    }
}

// adamw_step_clipped over 5 tensors of different sizes (one of them empty) for 3 steps against the
// composed per-tensor ops (sum_squares, scale_inplace, adamw_step) on the CPU.
TEST(OptimCuda, AdamWStepClippedMatchesComposedCpu) {
  AERIE_REQUIRE_CUDA();
  const std::vector<int64_t> sizes = {4096 * 3 + 5, 1, 0, 100003, 777};
  for (double max_norm : {0.5, 1e6, 0.0}) {  // clip active, inactive, disabled
    std::vector<Tensor> p, m, v, pg, mg, vg;
    for (size_t i = 0; i < sizes.size(); ++i) {
      p.push_back(testing::random_tensor({sizes[i]}, 50 + i));
      m.push_back(Tensor::zeros({sizes[i]}, DType::F32));
      v.push_back(Tensor::zeros({sizes[i]}, DType::F32));
      pg.push_back(gpu(p[i]));
      mg.push_back(gpu(m[i]));
      vg.push_back(gpu(v[i]));
    }
    for (int step = 1; step <= 3; ++step) {
      std::vector<Tensor> g, gg;
      for (size_t i = 0; i < sizes.size(); ++i) {
        g.push_back(testing::random_tensor({sizes[i]}, 60 + 10 * step + i, -0.1f, 0.1f));
        gg.push_back(gpu(g[i]));
      }
      // CPU reference: train/schedule.cc's clip_grad_norm, then adamw_step per tensor.
      double ss = 0;
      for (auto& t : g) ss += sum_squares(t);
      const double norm = std::sqrt(ss);
      if (max_norm > 0 && max_norm / (norm + 1e-6) < 1.0)
        for (auto& t : g) scale_inplace(t, static_cast<float>(max_norm / (norm + 1e-6)));
      for (size_t i = 0; i < sizes.size(); ++i) adamw_step(p[i], g[i], m[i], v[i], hyper(0.01f), step);

      std::vector<Tensor*> ps, ms, vs;
      std::vector<const Tensor*> gs;
      for (size_t i = 0; i < sizes.size(); ++i) {
        ps.push_back(&pg[i]);
        gs.push_back(&gg[i]);
        ms.push_back(&mg[i]);
        vs.push_back(&vg[i]);
      }
      const std::vector<float> g0 = gg[0].to_float_vector();
      const double got = adamw_step_clipped(ps, gs, ms, vs, hyper(0.01f), step, max_norm);
      // fp32 block partials vs a double sum: ~1e-7 relative typically
      EXPECT_NEAR(got, norm, 1e-5 * norm) << "step " << step << " max_norm " << max_norm;
      EXPECT_EQ(gg[0].to_float_vector(), g0) << "the gradients are left unchanged";
      EXPECT_EQ(max_norm > 0 && max_norm / (norm + 1e-6) < 1.0, max_norm == 0.5) << "the clip is active in the 0.5 case only";
      for (size_t i = 0; i < sizes.size(); ++i) {
        const std::string what = "tensor " + std::to_string(i) + " step " + std::to_string(step) + " max_norm " +
                                 std::to_string(max_norm);
        // Clip factors from the two norms differ by ~1e-7 relative, which m and v inherit; the update
        // m / sqrt(v) is nearly scale invariant, so params stay within a few ulp.
        testing::expect_close(pg[i].to_float_vector(), p[i].to_float_vector(), 1e-7f, 2e-6f, "param " + what);
        testing::expect_close(mg[i].to_float_vector(), m[i].to_float_vector(), 1e-9f, 1e-5f, "m " + what);
        testing::expect_close(vg[i].to_float_vector(), v[i].to_float_vector(), 1e-12f, 1e-5f, "v " + what);
      }
    }
  }
}

TEST(OptimCuda, GradHelpersMatchCpu) {
  AERIE_REQUIRE_CUDA();
  for (int64_t n : {1, 33, 4096, 1000003})
    for (DType dt : {DType::F32, DType::BF16}) {
      const std::string what = "n " + std::to_string(n) + " " + dtype_name(dt);
      Tensor x = random_as({n}, dt, 71), y = random_as({n}, dt, 72);
      Tensor xg = gpu(x), yg = gpu(y);
      const double ref = sum_squares(x), got = sum_squares(xg);
      EXPECT_NEAR(got, ref, 1e-5 * ref) << what;  // fp32 partial sums of 4096 terms vs a double sum
      scale_inplace(x, 0.37f);
      scale_inplace(xg, 0.37f);
      EXPECT_EQ(xg.to_float_vector(), x.to_float_vector()) << what;  // one fp32 multiply, one rounding
      add_inplace(y, x);
      add_inplace(yg, xg);
      EXPECT_EQ(yg.to_float_vector(), y.to_float_vector()) << what;  // one fp32 add, one rounding
      Tensor yf = testing::random_tensor({n}, 73), yfg = gpu(yf);  // F32 y += BF16 or F32 x
      add_inplace(yf, x);
      add_inplace(yfg, xg);
      EXPECT_EQ(yfg.to_float_vector(), yf.to_float_vector()) << what;
    }
}

}  // namespace
}  // namespace aerie
