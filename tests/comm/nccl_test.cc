// NcclCommunicator on exact inputs (small integers in F32/BF16, large I64 values), so that results can be
// required to be equal (the nccl-tests approach). Run on GPUs with `mpirun -np 2 test_comm
// --gtest_filter='Nccl*'` (tests/mpi/nccl.cmake); every Nccl test skips without CUDA or with fewer GPUs
// than ranks on the node (NCCL needs one GPU per rank), so the CPU-only CI passes them as skipped.
#include "comm/nccl_communicator.h"

#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "test_util.h"

namespace aerie {
namespace {

template <typename T>
std::vector<T> host_values(const Tensor& t) {
  const Tensor h = t.to_device(Device::CPU);
  return std::vector<T>(h.data<T>(), h.data<T>() + h.numel());
}

template <typename T>
Tensor on_gpu(const std::vector<T>& v) {
  return Tensor::from_vector(v, {static_cast<int64_t>(v.size())}).to_device(Device::CUDA);
}
/// EXPECTs that f throws aerie::Error mentioning `needle`.
void expect_error(const std::function<void()>& f, const std::string& needle) {
  const std::string msg = testing::error_of(f);
  EXPECT_NE(msg.find(needle), std::string::npos) << "error '" << msg << "' does not mention '" << needle << "'";
}

Tensor on_gpu_bf16(const std::vector<float>& v) {
  return Tensor::from_vector(v, {static_cast<int64_t>(v.size())}).to(DType::BF16).to_device(Device::CUDA);
}

class NcclCommunicatorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // The same decision on every rank of a node, so that no rank waits in a collective alone.
    if (!cuda::available()) GTEST_SKIP() << "NCCL test skipped: " << cuda::unavailable_reason();
    if (cuda::device_count() < local_size())
      GTEST_SKIP() << "NCCL test skipped: " << local_size() << " ranks on this node but " << cuda::device_count()
                   << " GPU(s); NCCL needs one GPU per rank";
    if (!comm_) comm_ = std::make_unique<NcclCommunicator>(*MpiCommunicator::world());
    n_ = comm_->size();
    r_ = comm_->rank();
  }
  static void TearDownTestSuite() { comm_.reset(); }  // collective: every rank runs the suite

  static std::unique_ptr<NcclCommunicator> comm_;
  int n_ = 1, r_ = 0;
};
std::unique_ptr<NcclCommunicator> NcclCommunicatorTest::comm_;

TEST_F(NcclCommunicatorTest, AllReduceSumIsExact) {
  EXPECT_EQ(comm_->size(), MpiCommunicator::world()->size());
  EXPECT_EQ(comm_->rank(), MpiCommunicator::world()->rank());
  // F32, 1037 elements (not a multiple of anything NCCL chunks by): x_i = r + i % 7.
  std::vector<float> f(1037);
  for (size_t i = 0; i < f.size(); ++i) f[i] = float(r_) + float(i % 7);
  Tensor tf = on_gpu(f);
  comm_->all_reduce_sum(tf);
  const auto gf = host_values<float>(tf);
  for (size_t i = 0; i < f.size(); ++i)
    ASSERT_EQ(gf[i], float(n_ * (n_ - 1) / 2 + n_ * int(i % 7))) << "F32 element " << i;
  // BF16: small integers, exact in bf16 and in every partial sum.
  Tensor tb = on_gpu_bf16({float(r_ + 1), 2.0f, -3.0f});
  comm_->all_reduce_sum(tb);
  EXPECT_EQ(tb.to_float_vector(), (std::vector<float>{float(n_ * (n_ + 1) / 2), 2.0f * n_, -3.0f * n_}));
  // I64 beyond 2^53 (not representable in fp32 or fp64) and I32.
  const int64_t big = int64_t{1} << 60;
  Tensor ti = on_gpu<int64_t>({big + r_, -r_});
  comm_->all_reduce_sum(ti);
  EXPECT_EQ(host_values<int64_t>(ti), (std::vector<int64_t>{big * n_ + n_ * (n_ - 1) / 2, -n_ * (n_ - 1) / 2}));
  Tensor t32 = on_gpu<int32_t>({r_, 7});
  comm_->all_reduce_sum(t32);
  EXPECT_EQ(host_values<int32_t>(t32), (std::vector<int32_t>{n_ * (n_ - 1) / 2, 7 * n_}));
}

TEST_F(NcclCommunicatorTest, AllReduceMax) {
  Tensor tf = on_gpu<float>({float(r_), -float(r_), 0.5f});
  comm_->all_reduce_max(tf);
  EXPECT_EQ(host_values<float>(tf), (std::vector<float>{float(n_ - 1), 0.0f, 0.5f}));
  Tensor tb = on_gpu_bf16({float(r_) + 0.5f, -1.0f});
  comm_->all_reduce_max(tb);
  EXPECT_EQ(tb.to_float_vector(), (std::vector<float>{float(n_ - 1) + 0.5f, -1.0f}));
  const int64_t big = int64_t{1} << 62;
  Tensor ti = on_gpu<int64_t>({big + r_, -big - r_});
  comm_->all_reduce_max(ti);
  EXPECT_EQ(host_values<int64_t>(ti), (std::vector<int64_t>{big + n_ - 1, -big}));
}

TEST_F(NcclCommunicatorTest, AllGatherConcatenatesInRankOrder) {
  Tensor in = on_gpu<int64_t>({r_ * 10, (int64_t{1} << 40) + r_, -r_});
  Tensor out = Tensor::empty({n_, 3}, DType::I64, Device::CUDA);
  comm_->all_gather(in, out);
  const auto g = host_values<int64_t>(out);
  for (int i = 0; i < n_; ++i) {
    EXPECT_EQ(g[3 * i], i * 10);
    EXPECT_EQ(g[3 * i + 1], (int64_t{1} << 40) + i);
    EXPECT_EQ(g[3 * i + 2], -i);
  }
  Tensor inf = on_gpu<float>({float(r_) + 0.25f, 3.0f});
  Tensor outf = Tensor::empty({2 * n_}, DType::F32, Device::CUDA);
  comm_->all_gather(inf, outf);
  Tensor inb = on_gpu_bf16({float(r_) - 0.5f});
  Tensor outb = Tensor::empty({n_}, DType::BF16, Device::CUDA);
  comm_->all_gather(inb, outb);
  const auto gf = host_values<float>(outf), gb = outb.to_float_vector();
  for (int i = 0; i < n_; ++i) {
    EXPECT_EQ(gf[2 * i], float(i) + 0.25f);
    EXPECT_EQ(gf[2 * i + 1], 3.0f);
    EXPECT_EQ(gb[i], float(i) - 0.5f);
  }
  Tensor bad = Tensor::empty({3 * n_ + 1}, DType::I64, Device::CUDA);
  // Thrown before any NCCL call, on every rank alike.
  expect_error([&] { comm_->all_gather(in, bad); }, "does not hold");
}

TEST_F(NcclCommunicatorTest, BroadcastFromEveryRoot) {
  for (int root = 0; root < n_; ++root) {
    SCOPED_TRACE(root);
    const bool me = r_ == root;
    Tensor tf = on_gpu<float>({me ? 1.5f : -1.0f, me ? float(root) : 99.0f});
    comm_->broadcast(tf, root);
    EXPECT_EQ(host_values<float>(tf), (std::vector<float>{1.5f, float(root)}));
    Tensor tb = on_gpu_bf16({me ? 3.0f : 0.0f});
    comm_->broadcast(tb, root);
    EXPECT_EQ(tb.to_float_vector(), std::vector<float>{3.0f});
    Tensor ti = on_gpu<int64_t>({me ? (int64_t{1} << 55) + root : 0});
    comm_->broadcast(ti, root);
    EXPECT_EQ(host_values<int64_t>(ti), std::vector<int64_t>{(int64_t{1} << 55) + root});
  }
  Tensor t = on_gpu<float>({1.0f});
  expect_error([&] { comm_->broadcast(t, n_); }, "not a rank");
}

TEST_F(NcclCommunicatorTest, AsyncAllReduceRunsAfterTheProducerOnAnotherStream) {
  // Gradient buckets: each is produced on the current stream by a device-to-device copy (queued, not
  // done, when the all-reduce is issued), then summed on a side stream; the event ordering must make the
  // sum see the copied values.
  cuda::Stream side = cuda::create_stream();
  const int64_t len = int64_t{1} << 22;  // 16 MiB of F32: a copy long enough to lose a race
  std::vector<Tensor> grads;
  for (int bucket = 0; bucket < 3; ++bucket) {
    std::vector<float> v(static_cast<size_t>(len), float(r_ + bucket));
    Tensor src = on_gpu(v);
    Tensor g = Tensor::zeros({len}, DType::F32, Device::CUDA);
    g.copy_from(src);  // device to device: queued on the current stream
    comm_->all_reduce_sum_async(g, side);
    grads.push_back(g);
  }
  cuda::synchronize(side);
  for (int bucket = 0; bucket < 3; ++bucket) {
    const auto h = host_values<float>(grads[static_cast<size_t>(bucket)]);
    const float want = float(n_ * (n_ - 1) / 2 + n_ * bucket);
    int bad = 0;
    for (float x : h) bad += x != want;
    EXPECT_EQ(bad, 0) << "bucket " << bucket << ": want " << want << ", e.g. got " << h.front() << " / " << h.back();
  }
  cuda::destroy_stream(side);
}

TEST_F(NcclCommunicatorTest, StartedSumsRunBesideTheCurrentStreamAndWaitOrdersThem) {
  // The tp overlap's pattern: micro-batch A's output produced on the current stream (a queued copy) and its
  // sum started, then B's; unrelated work queued on the current stream in between; after each wait() the
  // current stream's next work (a copy of the sum) must see the sum.
  const int64_t len = int64_t{1} << 22;  // 16 MiB of F32: a copy long enough to lose a race
  auto produced = [&](float x) {
    Tensor t = Tensor::zeros({len}, DType::F32, Device::CUDA);
    t.copy_from(on_gpu(std::vector<float>(static_cast<size_t>(len), x)));  // device to device: queued
    return t;
  };
  Tensor a = produced(float(r_));
  auto pa = comm_->start_all_reduce_sum(a);
  Tensor b = produced(float(r_ + 1));
  auto pb = comm_->start_all_reduce_sum(b);
  Tensor busy = produced(5.0f);  // the other micro-batch's compute, queued while the sums run
  pa->wait();
  Tensor ca = Tensor::zeros({len}, DType::F32, Device::CUDA);
  ca.copy_from(a);
  pb->wait();
  Tensor cb = Tensor::zeros({len}, DType::F32, Device::CUDA);
  cb.copy_from(b);
  const float sa = float(n_ * (n_ - 1) / 2), sb = sa + float(n_);
  for (auto [t, want] : {std::pair<Tensor*, float>{&ca, sa}, {&cb, sb}}) {
    const auto h = host_values<float>(*t);
    int bad = 0;
    for (float x : h) bad += x != want;
    EXPECT_EQ(bad, 0) << "want " << want << ", e.g. got " << h.front() << " / " << h.back();
  }
  EXPECT_EQ(host_values<float>(busy).front(), 5.0f);
}

TEST_F(NcclCommunicatorTest, BarrierAndErrors) {
  comm_->barrier();
  Tensor host = Tensor::zeros({2}, DType::F32);
  expect_error([&] { comm_->all_reduce_sum(host); }, "needs CUDA tensors");
  Tensor u8 = Tensor::zeros({2}, DType::U8, Device::CUDA);
  expect_error([&] { comm_->all_reduce_max(u8); }, "reductions take");
  comm_->barrier();
}

TEST(NodeLocalRank, IsWithinTheNode) {
  EXPECT_GE(local_rank(), 0);
  EXPECT_LT(local_rank(), local_size());
  EXPECT_LE(local_size(), MpiCommunicator::world()->size());
}

}  // namespace
}  // namespace aerie
