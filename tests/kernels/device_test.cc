// Device dispatch: tensors tagged CUDA (wrapping host memory that is never touched) make every op throw
// "backend is not built" in the CPU build; tensors on different devices are named in the error.
#include <vector>

#include "kernel_test_util.h"
#include "kernels/activation.h"
#include "kernels/attention.h"
#include "kernels/embedding.h"
#include "kernels/gemm.h"
#include "kernels/loss.h"
#include "kernels/norm.h"
#include "kernels/optim.h"
#include "kernels/rope.h"

namespace aerie {
namespace {

class DeviceDispatch : public ::testing::Test {
 protected:
  /// A CUDA-tagged F32 view of host memory (the CPU build never dereferences it).
  Tensor cuda(const Shape& s, DType dt = DType::F32) {
    bufs_.emplace_back(1024, 0.0f);
    return Tensor::wrap(bufs_.back().data(), s, dt, Device::CUDA);
  }
  std::vector<std::vector<float>> bufs_;
};

TEST_F(DeviceDispatch, CudaTensorsThrowNotBuilt) {
  if (cuda::built()) GTEST_SKIP() << "the CUDA backend is built: the ops dispatch to it (tests/kernels/*_cuda_test.cc)";
  Tensor a = cuda({2, 3}), b = cuda({3, 4}), c = cuda({2, 4});
  testing::expect_error([&] { matmul(a, b, c, false, false); }, "not built");
  Tensor x = cuda({2, 3}), w = cuda({3}), y = cuda({2, 3}), rstd = cuda({2});
  testing::expect_error([&] { rmsnorm_forward(x, w, 1e-5f, y, &rstd); }, "not built");
  testing::expect_error([&] { rmsnorm_backward(y, x, w, rstd, y, &w); }, "not built");
  testing::expect_error([&] { swiglu_forward(x, x, y); }, "not built");
  testing::expect_error([&] { swiglu_backward(x, x, x, y, y); }, "not built");
  Tensor q = cuda({2, 2, 4}), k = cuda({2, 1, 4}), lse = cuda({2, 2});
  testing::expect_error([&] { attention_forward(q, k, k, 0, 1.0f, q, &lse); }, "not built");
  testing::expect_error([&] { attention_backward(q, q, k, k, q, lse, 0, 1.0f, q, k, k); }, "not built");
  Tensor xr = cuda({2, 2, 4}), pos = cuda({2}, DType::I32);
  testing::expect_error([&] { rope_apply(xr, pos, {1.0f, 0.5f}); }, "not built");
  Tensor ids = cuda({2}, DType::I32);
  testing::expect_error([&] { embedding_forward(ids, x, y); }, "not built");
  testing::expect_error([&] { soft_cross_entropy(x, x, rstd, &y); }, "not built");
  testing::expect_error([&] { softmax_rows(x, y); }, "not built");
  testing::expect_error([&] { argmax_rows(x); }, "not built");
  testing::expect_error([&] { adamw_step(x, x, x, x, AdamWParams{}, 1); }, "not built");
  testing::expect_error([&] { sum_squares(x); }, "not built");
  testing::expect_error([&] { scale_inplace(x, 2.0f); }, "not built");
  testing::expect_error([&] { add_inplace(x, y); }, "not built");
}

TEST_F(DeviceDispatch, MixedDevicesNameTheTensor) {
  Tensor a = Tensor::zeros({2, 3}, DType::F32), b = Tensor::zeros({3, 4}, DType::F32);
  Tensor c = cuda({2, 4});
  testing::expect_error([&] { matmul(a, b, c, false, false); }, "tensor c is on cuda");
  Tensor g = Tensor::zeros({2, 3}, DType::F32), m = Tensor::zeros({2, 3}, DType::F32);
  Tensor v = cuda({2, 3});
  testing::expect_error([&] { adamw_step(a, g, m, v, AdamWParams{}, 1); }, "tensor v is on cuda");
}

}  // namespace
}  // namespace aerie
