// OpProfile (model/op_profile.h): times are summed per category on the CPU and on CUDA, the summary
// names the categories, and a disabled profile times nothing.
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "core/device.h"
#include "kernels/gemm.h"
#include "model/op_profile.h"
#include "test_util.h"

namespace aerie {
namespace {

TEST(OpProfile, SumsCpuTimesPerCategory) {
  OpProfile p;
  p.enable(true);
  int runs = 0;
  p.time(OpKind::Gemm, Device::CPU, [&] {
    ++runs;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  });
  p.time(OpKind::Norm, Device::CPU, [&] { ++runs; });
  p.count_forward(7);
  EXPECT_EQ(runs, 2);
  const std::string s = p.summary();
  EXPECT_NE(s.find("1 forward calls, 7 rows"), std::string::npos) << s;
  // 20 ms of sleep: at least 19 ms (steady_clock), and the largest share.
  const size_t g = s.find("gemm ");
  ASSERT_NE(g, std::string::npos) << s;
  EXPECT_GE(std::stod(s.substr(g + 5)), 19.0) << s;
  EXPECT_NE(s.find("all-reduce"), std::string::npos) << s;
}

TEST(OpProfile, DisabledRunsTheOpAndReportsNothing) {
  OpProfile p;
  int runs = 0;
  p.time(OpKind::Attention, Device::CPU, [&] { ++runs; });
  p.count_forward(3);
  EXPECT_EQ(runs, 1);
  EXPECT_EQ(p.summary(), "");
}

TEST(OpProfileCuda, TimesAGemmWithEvents) {
  AERIE_REQUIRE_CUDA();
  OpProfile p;
  p.enable(true);
  Tensor a = Tensor::zeros({1024, 1024}, DType::BF16, Device::CUDA);
  Tensor c = Tensor::empty({1024, 1024}, DType::F32, Device::CUDA);
  for (int i = 0; i < 3; ++i) p.time(OpKind::Gemm, Device::CUDA, [&] { matmul(a, a, c, false, true); });
  p.count_forward(1024);
  const std::string s = p.summary();
  const size_t g = s.find("gemm ");
  ASSERT_NE(g, std::string::npos) << s;
  EXPECT_GT(std::stod(s.substr(g + 5)), 0.0) << s;
}

}  // namespace
}  // namespace aerie
