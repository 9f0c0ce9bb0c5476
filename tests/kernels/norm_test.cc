// RMSNorm forward against a double reference; finite-difference checks of dx and dw.
#include "kernels/norm.h"

#include <cmath>

#include "kernel_test_util.h"

namespace aerie {
namespace {

using testing::random_tensor;

TEST(RmsNorm, ForwardMatchesDoubleReference) {
  const int64_t n = 4, h = 24;
  const float eps = 1e-5f;
  Tensor x = random_tensor({n, h}, 1, -2.0f, 2.0f), w = random_tensor({h}, 2, 0.5f, 1.5f);
  Tensor y = Tensor::empty({n, h}, DType::F32), rstd = Tensor::empty({n}, DType::F32);
  rmsnorm_forward(x, w, eps, y, &rstd);
  const auto xv = x.to_float_vector(), wv = w.to_float_vector();
  std::vector<float> yref(n * h), rref(n);
  for (int64_t r = 0; r < n; ++r) {
    double ss = 0.0;
    for (int64_t j = 0; j < h; ++j) ss += double(xv[r * h + j]) * xv[r * h + j];
    const double rs = 1.0 / std::sqrt(ss / h + eps);
    rref[r] = float(rs);
    for (int64_t j = 0; j < h; ++j) yref[r * h + j] = float(wv[j] * xv[r * h + j] * rs);
  }
  testing::expect_close(y.to_float_vector(), yref, 1e-6f, 1e-5f, "y");
  testing::expect_close(rstd.to_float_vector(), rref, 0.0f, 1e-5f, "rstd");

  // In place (y aliases x) and without rstd: same values.
  Tensor x2 = x.clone();
  rmsnorm_forward(x2, w, eps, x2, nullptr);
  EXPECT_EQ(x2.to_float_vector(), y.to_float_vector());
}

TEST(RmsNorm, BackwardMatchesFiniteDifferences) {
  const int64_t n = 3, h = 8;
  const float eps = 1e-5f;
  Tensor x = random_tensor({n, h}, 3, -2.0f, 2.0f), w = random_tensor({h}, 4, 0.5f, 1.5f);
  Tensor r = random_tensor({n, h}, 5);  // L = <y, r>, dL/dy = r
  Tensor y = Tensor::empty({n, h}, DType::F32), rstd = Tensor::empty({n}, DType::F32);
  auto loss = [&] {
    rmsnorm_forward(x, w, eps, y, nullptr);
    return testing::dot_double(y, r);
  };
  const auto gx = testing::numeric_grad(x, loss), gw = testing::numeric_grad(w, loss);

  rmsnorm_forward(x, w, eps, y, &rstd);
  Tensor dx = random_tensor({n, h}, 6);  // overwritten
  Tensor dw = Tensor::from_vector(std::vector<float>(h, 0.25f), {h});  // added to
  rmsnorm_backward(r, x, w, rstd, dx, &dw);
  testing::expect_close(dx.to_float_vector(), gx, testing::kFdAtol, testing::kFdRtol, "dx");
  std::vector<float> dw_delta = dw.to_float_vector();
  for (auto& d : dw_delta) d -= 0.25f;
  testing::expect_close(dw_delta, gw, testing::kFdAtol, testing::kFdRtol, "dw");

  Tensor dx2 = Tensor::empty({n, h}, DType::F32);
  rmsnorm_backward(r, x, w, rstd, dx2, nullptr);  // frozen weight
  EXPECT_EQ(dx2.to_float_vector(), dx.to_float_vector());

  Tensor dy_inplace = r.clone(), dw2 = Tensor::from_vector(std::vector<float>(h, 0.25f), {h});
  rmsnorm_backward(dy_inplace, x, w, rstd, dy_inplace, &dw2);  // dx aliases dy
  EXPECT_EQ(dy_inplace.to_float_vector(), dx.to_float_vector());
  EXPECT_EQ(dw2.to_float_vector(), dw.to_float_vector());
}

TEST(RmsNorm, ErrorsNameTheTensor) {
  Tensor x = random_tensor({2, 4}, 1), y = Tensor::empty({2, 4}, DType::F32);
  Tensor w_bad = random_tensor({5}, 2), w = random_tensor({4}, 2);
  testing::expect_error([&] { rmsnorm_forward(x, w_bad, 1e-5f, y, nullptr); }, "rmsnorm_forward: w");
  Tensor rstd_bad = Tensor::empty({3}, DType::F32);
  testing::expect_error([&] { rmsnorm_forward(x, w, 1e-5f, y, &rstd_bad); }, "rstd");
  Tensor rstd = Tensor::empty({2}, DType::F32), dx_bad = Tensor::empty({2, 5}, DType::F32);
  testing::expect_error([&] { rmsnorm_backward(x, x, w, rstd, dx_bad, nullptr); }, "rmsnorm_backward: dx");
}

// BF16 activations and weights: widened to fp32, computed as F32, the outputs rounded once.
TEST(RmsNorm, Bf16IsWidenedAndRounded) {
  const int64_t n = 3, h = 10;
  Tensor x = testing::random_tensor({n, h}, 7, -2.0f, 2.0f).to(DType::BF16);
  Tensor w = testing::random_tensor({h}, 8, 0.5f, 1.5f).to(DType::BF16);
  Tensor xf = x.to(DType::F32), wf = w.to(DType::F32);
  Tensor yf = Tensor::empty({n, h}, DType::F32), rf = Tensor::empty({n}, DType::F32);
  rmsnorm_forward(xf, wf, 1e-5f, yf, &rf);
  Tensor y = Tensor::empty({n, h}, DType::BF16), r = Tensor::empty({n}, DType::F32);
  rmsnorm_forward(x, w, 1e-5f, y, &r);
  EXPECT_EQ(y.to_float_vector(), yf.to(DType::BF16).to_float_vector());
  EXPECT_EQ(r.to_float_vector(), rf.to_float_vector());
  rmsnorm_forward(x, w, 1e-5f, x, nullptr);  // in place, BF16
  EXPECT_EQ(x.to_float_vector(), y.to_float_vector());

  Tensor dy = testing::random_tensor({n, h}, 9).to(DType::BF16);
  Tensor dxf = Tensor::empty({n, h}, DType::F32), dwf = Tensor::zeros({h}, DType::F32);
  rmsnorm_backward(dy.to(DType::F32), xf, wf, rf, dxf, &dwf);
  Tensor dx = Tensor::empty({n, h}, DType::BF16), dw = Tensor::zeros({h}, DType::F32);
  rmsnorm_backward(dy, xf.to(DType::BF16), w, r, dx, &dw);
  EXPECT_EQ(dx.to_float_vector(), dxf.to(DType::BF16).to_float_vector());
  EXPECT_EQ(dw.to_float_vector(), dwf.to_float_vector());
}

}  // namespace
}  // namespace aerie
