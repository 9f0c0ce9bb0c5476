// RMSNorm on CUDA against the CPU reference (kernels/cpu/norm.cc) on the same inputs: every F32/BF16
// combination of activations, weight and output, forward and backward (dw accumulated), in place,
// odd widths, H = 4096 and one row. Skipped without a GPU.
#include "cuda_test_util.h"
#include "kernels/norm.h"

namespace aerie {
namespace {

using testing::expect_close_as;
using testing::gpu;
using testing::random_as;

struct Rows {
  int64_t n, h;
};
const Rows kShapes[] = {{1, 4096}, {7, 33}, {64, 4096}, {5, 1000}, {300, 96}, {1, 1}};
constexpr float kEps = 1e-5f;

std::string label(const Rows& s, DType a, DType b, DType c) {
  return "N " + std::to_string(s.n) + " H " + std::to_string(s.h) + " " + dtype_name(a) + "/" + dtype_name(b) +
         "/" + dtype_name(c);
}

TEST(RmsNormCuda, ForwardMatchesCpu) {
  AERIE_REQUIRE_CUDA();
  for (const Rows& s : kShapes)
    for (DType xt : {DType::F32, DType::BF16})
      for (DType wt : {DType::F32, DType::BF16})
        for (DType yt : {DType::F32, DType::BF16}) {
          const std::string what = label(s, xt, wt, yt);
          Tensor x = random_as({s.n, s.h}, xt, 1, -2.0f, 2.0f), w = random_as({s.h}, wt, 2, 0.5f, 1.5f);
          Tensor y = Tensor::empty({s.n, s.h}, yt), rstd = Tensor::empty({s.n}, DType::F32);
          rmsnorm_forward(x, w, kEps, y, &rstd);
          Tensor xg = gpu(x), wg = gpu(w);
          Tensor yg = Tensor::empty({s.n, s.h}, yt, Device::CUDA), rg = Tensor::empty({s.n}, DType::F32, Device::CUDA);
          rmsnorm_forward(xg, wg, kEps, yg, &rg);
          expect_close_as(yg, y, yt, "y " + what);
          expect_close_as(rg, rstd, DType::F32, "rstd " + what);
          if (xt == yt) {  // in place, without rstd: the same values
            rmsnorm_forward(xg, wg, kEps, xg, nullptr);
            EXPECT_EQ(xg.to_float_vector(), yg.to_float_vector()) << what;
          }
        }
}

TEST(RmsNormCuda, BackwardMatchesCpu) {
  AERIE_REQUIRE_CUDA();
  for (const Rows& s : kShapes)
    for (DType at : {DType::F32, DType::BF16})      // dy, x, dx
      for (DType wt : {DType::F32, DType::BF16}) {  // w
        const std::string what = label(s, at, wt, at);
        Tensor x = random_as({s.n, s.h}, at, 3, -2.0f, 2.0f), w = random_as({s.h}, wt, 4, 0.5f, 1.5f);
        Tensor dy = random_as({s.n, s.h}, at, 5);
        Tensor y = Tensor::empty({s.n, s.h}, DType::F32), rstd = Tensor::empty({s.n}, DType::F32);
        rmsnorm_forward(x, w, kEps, y, &rstd);
        Tensor dw0 = testing::random_tensor({s.h}, 6);  // dw is added to
        Tensor dx = Tensor::empty({s.n, s.h}, at), dw = dw0.clone();
        rmsnorm_backward(dy, x, w, rstd, dx, &dw);

        Tensor dyg = gpu(dy), xg = gpu(x), wg = gpu(w), rg = gpu(rstd), dwg = gpu(dw0);
        Tensor dxg = Tensor::empty({s.n, s.h}, at, Device::CUDA);
        rmsnorm_backward(dyg, xg, wg, rg, dxg, &dwg);
        expect_close_as(dxg, dx, at, "dx " + what);
        expect_close_as(dwg, dw, DType::F32, "dw " + what);

        // dx aliasing dy, frozen weight: the same dx.
        rmsnorm_backward(dyg, xg, wg, rg, dyg, nullptr);
        EXPECT_EQ(dyg.to_float_vector(), dxg.to_float_vector()) << what;
      }
}

TEST(RmsNormCuda, BackwardMixedDtypesAndManyRows) {
  AERIE_REQUIRE_CUDA();
  // BF16 activations, F32 gradients and weight; more rows than one dw chunk holds (40000 > 1024 x 32).
  const int64_t n = 40000, h = 72;
  Tensor x = random_as({n, h}, DType::BF16, 7, -2.0f, 2.0f), w = random_as({h}, DType::F32, 8, 0.5f, 1.5f);
  Tensor dy = random_as({n, h}, DType::F32, 9);
  Tensor y = Tensor::empty({n, h}, DType::BF16), rstd = Tensor::empty({n}, DType::F32);
  rmsnorm_forward(x, w, kEps, y, &rstd);
  Tensor dx = Tensor::empty({n, h}, DType::F32), dw = Tensor::zeros({h}, DType::F32);
  rmsnorm_backward(dy, x, w, rstd, dx, &dw);
  Tensor dxg = Tensor::empty({n, h}, DType::F32, Device::CUDA), dwg = Tensor::zeros({h}, DType::F32, Device::CUDA);
  rmsnorm_backward(gpu(dy), gpu(x), gpu(w), gpu(rstd), dxg, &dwg);
  expect_close_as(dxg, dx, DType::F32, "dx");
  // dw sums 40000 terms of random sign, |dw| ~ 200: fp32 order effects ~ sqrt(40000) ulp of the
  // partial sums ~ 1e-4 absolute.
  testing::expect_close(dwg.to_float_vector(), dw.to_float_vector(), 1e-3f, 1e-5f, "dw");
}

}  // namespace
}  // namespace aerie
