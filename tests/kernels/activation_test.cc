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
  Tensor u4 = random_tensor({2, 4}, 2), dg = Tensor::empty({2, 4}, DType::I32);
  testing::expect_error([&] { swiglu_backward(out, g, u4, dg, out); }, "swiglu_backward: dgate");
}

// BF16 inputs and outputs: widened to fp32, computed as F32, each output rounded once.
TEST(Swiglu, Bf16IsWidenedAndRounded) {
  const Shape s{3, 7};
  Tensor g = testing::random_tensor(s, 11, -4.0f, 4.0f).to(DType::BF16), u = testing::random_tensor(s, 12);
  Tensor of = Tensor::empty(s, DType::F32), o = Tensor::empty(s, DType::BF16);
  swiglu_forward(g.to(DType::F32), u, of);
  swiglu_forward(g, u, o);  // BF16 gate, F32 up -> BF16 out
  EXPECT_EQ(o.to_float_vector(), of.to(DType::BF16).to_float_vector());
  Tensor d = testing::random_tensor(s, 13).to(DType::BF16);
  Tensor dgf = Tensor::empty(s, DType::F32), duf = Tensor::empty(s, DType::F32);
  swiglu_backward(d.to(DType::F32), g.to(DType::F32), u, dgf, duf);
  Tensor dg = Tensor::empty(s, DType::BF16), du = Tensor::empty(s, DType::F32);
  swiglu_backward(d, g, u, dg, du);
  EXPECT_EQ(dg.to_float_vector(), dgf.to(DType::BF16).to_float_vector());
  EXPECT_EQ(du.to_float_vector(), duf.to_float_vector());
}

}  // namespace
}  // namespace aerie
