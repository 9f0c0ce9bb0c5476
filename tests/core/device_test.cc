// Device memory of Tensor (core/device.h): host <-> GPU copies, zero fill, clone; skipped without a GPU.
#include <gtest/gtest.h>

#include "core/device.h"
#include "core/tensor.h"
#include "test_util.h"

namespace aerie {
namespace {

TEST(Device, ReportsWhyUnavailable) {
  if (cuda::available())
    EXPECT_EQ(cuda::unavailable_reason(), "");
  else
    EXPECT_NE(cuda::unavailable_reason(), "");
}

TEST(Device, EmptyOnCudaWithoutGpuThrows) {
  if (cuda::available()) GTEST_SKIP() << "a GPU is present";
  EXPECT_THROW(Tensor::empty({4}, DType::F32, Device::CUDA), Error);
}

TEST(Device, RoundTripCopiesAndZeroFill) {
  AERIE_REQUIRE_CUDA();
  std::vector<float> v(1000);
  for (size_t i = 0; i < v.size(); ++i) v[i] = 0.5f * static_cast<float>(i) - 7.0f;
  Tensor h = Tensor::from_vector(v, {10, 100});
  Tensor d = h.to_device(Device::CUDA);
  EXPECT_EQ(d.device(), Device::CUDA);
  Tensor d2 = d.clone();                      // device to device
  Tensor back = d2.slice(2, 5).to_device(Device::CPU);  // a view's offset survives the copy
  std::vector<float> want(v.begin() + 200, v.begin() + 500);
  EXPECT_EQ(back.to_float_vector(), want);
  d2.fill_zero();
  for (float x : d2.to_float_vector()) ASSERT_EQ(x, 0.0f);
  EXPECT_EQ(d.to_float_vector(), v);  // the clone was a copy
}

}  // namespace
}  // namespace aerie
