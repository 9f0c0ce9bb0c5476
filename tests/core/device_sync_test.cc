// The CUDA runtime wrappers of src/core used by the data, model and job layers (core/device_event.h,
// core/pinned_memory.h, core/device_memory.h): an asynchronous device-to-host copy into a pinned buffer
// ordered by events, timing events, the memory queries; and what each does in a build without the
// backend (throws aerie::Error, or answers "unknown" for the memory queries). GPU cases skip without one.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "core/device.h"
#include "core/device_event.h"
#include "core/device_memory.h"
#include "core/pinned_memory.h"
#include "core/tensor.h"
#include "test_util.h"

namespace aerie {
namespace {

TEST(DeviceSync, WithoutTheBackendMakingThrowsAndMemoryIsUnknown) {
  if (cuda::built()) GTEST_SKIP() << "aerie was built with the CUDA backend";
  EXPECT_THROW(cuda::Event(), Error);
  EXPECT_THROW(cuda::Event(true), Error);
  EXPECT_THROW(cuda::OwnedStream(), Error);
  EXPECT_THROW(cuda::PinnedBuffer(16), Error);
  EXPECT_THROW(cuda::set_thread_device(0), Error);
  std::vector<char> host(4);
  EXPECT_THROW(cuda::copy_to_host_async(host.data(), host.data(), host.size(), nullptr), Error);
  EXPECT_FALSE(cuda::device_memory().has_value());
  EXPECT_FALSE(cuda::pool_high_water_bytes().has_value());
}

TEST(DeviceSync, EmptyPinnedBufferHoldsNothing) {
  cuda::PinnedBuffer b;  // no allocation: fine in either build
  EXPECT_EQ(b.data(), nullptr);
  EXPECT_EQ(b.size(), 0u);
  cuda::PinnedBuffer moved(std::move(b));
  EXPECT_EQ(moved.data(), nullptr);
}

TEST(DeviceSync, CopyToPinnedHostOnASideStreamAfterAnEvent) {
  AERIE_REQUIRE_CUDA();
  std::vector<float> v(100000);
  for (size_t i = 0; i < v.size(); ++i) v[i] = 0.25f * static_cast<float>(i) - 3.0f;
  Tensor d = Tensor::from_vector(v, {static_cast<int64_t>(v.size())}).to_device(Device::CUDA);
  cuda::OwnedStream side;
  side.wait_for(cuda::current_stream());  // after the upload on the current stream
  cuda::PinnedBuffer host(d.nbytes());
  ASSERT_NE(host.data(), nullptr);
  EXPECT_EQ(host.size(), d.nbytes());
  cuda::copy_to_host_async(host.data(), d.raw(), d.nbytes(), side.get());
  cuda::Event done;
  done.record(side.get());
  done.synchronize();
  EXPECT_TRUE(done.query());
  EXPECT_TRUE(done.wait());
  std::vector<float> got(v.size());
  std::memcpy(got.data(), host.data(), d.nbytes());
  EXPECT_EQ(got, v);
  cuda::PinnedBuffer moved = std::move(host);  // the memory moves with the object
  EXPECT_EQ(moved.size(), d.nbytes());
  EXPECT_EQ(host.data(), nullptr);
}

TEST(DeviceSync, TimingEventsMeasureNonNegativeTime) {
  AERIE_REQUIRE_CUDA();
  cuda::Event a(true), b(true);
  a.record(cuda::current_stream());
  Tensor t = Tensor::zeros({1 << 20}, DType::F32, Device::CUDA);
  b.record(cuda::current_stream());
  b.synchronize();
  EXPECT_GE(cuda::elapsed_ms(a, b), 0.0f);
}

TEST(DeviceSync, MemoryQueriesSeeThePoolsAllocations) {
  AERIE_REQUIRE_CUDA();
  const int64_t bytes = int64_t{64} << 20;
  Tensor t = Tensor::empty({bytes / 4}, DType::F32, Device::CUDA);
  cuda::synchronize();
  const auto mem = cuda::device_memory();
  ASSERT_TRUE(mem.has_value());
  EXPECT_GT(mem->total_bytes, 0);
  EXPECT_LE(mem->free_bytes, mem->total_bytes);
  const auto high = cuda::pool_high_water_bytes();
  ASSERT_TRUE(high.has_value());
  EXPECT_GE(*high, bytes);
}

}  // namespace
}  // namespace aerie
