// copy_columns (kernels/tensor_ops.h): the CPU reference against a plain loop, its checks, and CUDA
// against the CPU (bitwise: it is a copy) for F32, BF16 and I32, odd widths and offsets. CUDA tests are
// skipped without a GPU.
#include "cuda_test_util.h"
#include "kernels/tensor_ops.h"

namespace aerie {
namespace {

using testing::gpu;
using testing::random_as;

struct Case {
  int64_t rows, cs, cd, sc, dc, n;
};
const Case kCases[] = {{1, 1, 1, 0, 0, 1}, {3, 5, 7, 1, 2, 4}, {17, 64, 128, 0, 64, 64}, {33, 129, 65, 3, 0, 65}};

TEST(TensorOps, CopyColumnsCpuMatchesLoop) {
  for (const Case& c : kCases) {
    Tensor src = random_as({c.rows, c.cs}, DType::F32, 1);
    Tensor dst = random_as({c.rows, c.cd}, DType::F32, 2);
    Tensor before = dst.clone();
    copy_columns(src, c.sc, dst, c.dc, c.n);
    for (int64_t i = 0; i < c.rows; ++i)
      for (int64_t j = 0; j < c.cd; ++j) {
        const bool in = j >= c.dc && j < c.dc + c.n;
        const float want = in ? src.data<float>()[i * c.cs + c.sc + j - c.dc] : before.data<float>()[i * c.cd + j];
        ASSERT_EQ(dst.data<float>()[i * c.cd + j], want) << "row " << i << " col " << j;
      }
  }
}

TEST(TensorOps, CopyColumnsChecks) {
  Tensor src = Tensor::zeros({3, 4}, DType::F32), dst = Tensor::zeros({3, 6}, DType::F32);
  EXPECT_THROW(copy_columns(src, 1, dst, 0, 4), Error);  // past src
  EXPECT_THROW(copy_columns(src, 0, dst, 3, 4), Error);  // past dst
  Tensor rows = Tensor::zeros({2, 6}, DType::F32);
  EXPECT_THROW(copy_columns(src, 0, rows, 0, 2), Error);
  Tensor bf = Tensor::zeros({3, 6}, DType::BF16);
  EXPECT_THROW(copy_columns(src, 0, bf, 0, 2), Error);
}

TEST(TensorOpsCuda, CopyColumnsMatchesCpu) {
  AERIE_REQUIRE_CUDA();
  for (const Case& c : kCases)
    for (DType dt : {DType::F32, DType::BF16, DType::I32}) {
      Tensor src = dt == DType::I32 ? Tensor::from_vector(std::vector<int32_t>(c.rows * c.cs, 7), {c.rows, c.cs})
                                    : random_as({c.rows, c.cs}, dt, 3);
      if (dt == DType::I32)
        for (int64_t i = 0; i < src.numel(); ++i) src.data<int32_t>()[i] = static_cast<int32_t>(i * 13 - 5);
      Tensor dst = dt == DType::I32 ? Tensor::zeros({c.rows, c.cd}, dt) : random_as({c.rows, c.cd}, dt, 4);
      Tensor dg = gpu(dst);
      copy_columns(src, c.sc, dst, c.dc, c.n);
      copy_columns(gpu(src), c.sc, dg, c.dc, c.n);
      const std::vector<float> got = dg.to_float_vector(), want = dst.to_float_vector();
      ASSERT_EQ(got, want) << dtype_name(dt) << " rows " << c.rows << " cols " << c.n;
    }
}

}  // namespace
}  // namespace aerie
