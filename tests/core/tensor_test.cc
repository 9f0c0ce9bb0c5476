#include "core/tensor.h"

#include <gtest/gtest.h>

namespace aerie {

TEST(Tensor, SliceAndReshapeShareStorage) {
  Tensor t = Tensor::from_vector<float>({0, 1, 2, 3, 4, 5}, {3, 2});
  Tensor s = t.slice(1, 3);
  EXPECT_EQ(s.shape(), (Shape{2, 2}));
  s.data<float>()[0] = 42;
  EXPECT_EQ(t.data<float>()[2], 42);
  EXPECT_EQ(t.reshape({6}).data<float>()[2], 42);
  EXPECT_THROW(t.slice(2, 4), Error);
  EXPECT_THROW(t.reshape({4}), Error);
}

TEST(Tensor, WrongDtypeAccessThrows) {
  Tensor t = Tensor::zeros({2}, DType::I32);
  EXPECT_THROW(t.data<float>(), Error);
  EXPECT_NO_THROW(t.data<int32_t>());
}

TEST(Tensor, Bf16RoundsToNearestEven) {
  // 1 + 2^-8 lies halfway between bf16 1.0 and 1 + 2^-7: ties go to the even mantissa (1.0).
  EXPECT_EQ(round_bf16(1.0f + 1.0f / 256), 1.0f);
  EXPECT_EQ(round_bf16(1.0f + 3.0f / 256), 1.0f + 4.0f / 256);
  Tensor t = Tensor::from_vector<float>({1.5f, -2.25f}, {2});
  EXPECT_EQ(t.to(DType::BF16).to(DType::F32).to_float_vector(), (std::vector<float>{1.5f, -2.25f}));
}

TEST(Tensor, CheckShapeNamesTheTensor) {
  Tensor t = Tensor::zeros({2, 3}, DType::F32);
  EXPECT_NO_THROW(t.check_shape({-1, 3}, "x"));
  try {
    t.check_shape({2, 4}, "fc.weight");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("fc.weight"), std::string::npos);
  }
}

}  // namespace aerie
