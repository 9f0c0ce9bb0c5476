// SwiGLU forward against a double reference; backward against finite differences.
#include "kernels/activation.h"

#include <cmath>

#include "kernel_test_util.h"

namespace aerie {
namespace {

using testing::random_tensor;

TEST(Swiglu, ForwardMatchesDoubleReference) {
  Tensor g = random_tensor({3, 10}, 1, -6.0f, 6.0f), u = random_tensor({3, 10}, 2);
  Tensor out = Tensor::empty({3, 10}, DType::F32);
  swiglu_forward(g, u, out);
  const auto gv = g.to_float_vector(), uv = u.to_float_vector();
  std::vector<float> ref(gv.size());
  for (size_t i = 0; i < gv.size(); ++i) ref[i] = float(gv[i] / (1.0 + std::exp(-double(gv[i]))) * uv[i]);
  testing::expect_close(out.to_float_vector(), ref, 1e-6f, 1e-6f, "out");
}

TEST(Swiglu, BackwardMatchesFiniteDifferences) {
  Tensor g = random_tensor({2, 7}, 3, -4.0f, 4.0f), u = random_tensor({2, 7}, 4), r = random_tensor({2, 7}, 5);
  Tensor out = Tensor::empty({2, 7}, DType::F32);
  auto loss = [&] {
    swiglu_forward(g, u, out);
    return testing::dot_double(out, r);
  };
  const auto gg = testing::numeric_grad(g, loss), gu = testing::numeric_grad(u, loss);
  Tensor dg = Tensor::empty({2, 7}, DType::F32), du = Tensor::empty({2, 7}, DType::F32);
  swiglu_backward(r, g, u, dg, du);
  testing::expect_close(dg.to_float_vector(), gg, testing::kFdAtol, testing::kFdRtol, "dgate");
  testing::expect_close(du.to_float_vector(), gu, testing::kFdAtol, testing::kFdRtol, "dup");
}

TEST(Swiglu, ErrorsNameTheTensor) {
  Tensor g = random_tensor({2, 4}, 1), u = random_tensor({2, 5}, 2), out = Tensor::empty({2, 4}, DType::F32);
  testing::expect_error([&] { swiglu_forward(g, u, out); }, "swiglu_forward: up");
  Tensor u4 = random_tensor({2, 4}, 2), dg = Tensor::empty({2, 4}, DType::BF16);
  testing::expect_error([&] { swiglu_backward(out, g, u4, dg, out); }, "swiglu_backward: dgate");
}

}  // namespace
}  // namespace aerie
