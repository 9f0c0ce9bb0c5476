// train_step on CUDA against the CPU: the same tiny draft, the same batches, a few AdamW steps, one rank
// (dp = self; NCCL is exercised by `aerie train` on several GPUs, not here). Both compute in fp32 and
// differ only in fp32 summation order (cuBLASLt vs OpenBLAS, kernel reductions), ~1e-6 relative per op,
// so per step:
//  - the loss and the gradient norm agree to 1e-4 relative (their own error is ~1e-6; 100x margin for
//    the growth through the steps, which each start from weights that differ by that rounding);
//  - the weights: AdamW moves an element by at most ~1.2 lr per step whatever its gradient (|m_hat| /
//    sqrt(v_hat) <= (1 - b1) / sqrt((1 - b2)(1 - b1^2 / b2)) ~ 1.17 for betas 0.9/0.95), so an element whose
//    gradient is rounding noise may take another step in each run: |w_gpu - w_cpu| <= 3 steps lr bounds
//    the difference (checked), and the typical difference is far smaller (the mean abs difference is
//    checked against 5e-2 steps lr).
// Skipped without a GPU. (bf16 compute: train_bf16_test.cc.)
// TrainStepDpNccl*: dp over the world's ranks on GPUs (one per rank), the gradients summed by NCCL with
// the all-reduce overlapped with the last sample's backward, against one rank with the whole batch; run
// by ctest train_dp2 (mpirun -np 2) and skipped unless every rank has its own GPU.
#include <cmath>

#include "comm/communicator.h"
#include "comm/nccl_communicator.h"
#include "train/train_testing.h"
#include "train/trainer.h"

namespace aerie {
namespace {

std::vector<TTTSample> make_batch(const testing::TinyTrainSetup& s, int n, uint64_t seed) {
  std::vector<TTTSample> b;
  for (int i = 0; i < n; ++i) b.push_back(testing::make_random_sample(s, 9 + 4 * i, seed + static_cast<uint64_t>(i)));
  return b;
}

std::string rank_scratch(const std::string& name) {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return testing::scratch_dir(name + "_r" + std::to_string(rank));
}

TEST(TrainCuda, StepsMatchCpu) {
  AERIE_REQUIRE_CUDA();
  auto s = testing::make_tiny_setup(rank_scratch("train_cuda_steps"));
  auto world = MpiCommunicator::world();
  auto self = world->split(world->rank(), 0);
  constexpr int kSteps = 5, kTtt = 4;
  constexpr double kLr = 1e-3;
  DraftWeights w_cpu = testing::clone_weights(s.w);
  AdamState o_cpu = AdamState::zeros(s.cfg);
  StepScratch sc_cpu = StepScratch::zeros(s.cfg);
  DraftWeights w_gpu = s.w.to_device(Device::CUDA);
  AdamState o_gpu = AdamState::zeros(s.cfg, Device::CUDA);
  StepScratch sc_gpu = StepScratch::zeros(s.cfg, Device::CUDA, DType::F32);  // fp32 compute: the CPU's
  const Tensor embed_gpu = s.embed.to_device(Device::CUDA);
  for (int step = 0; step < kSteps; ++step) {
    std::vector<TTTSample> batch = make_batch(s, 3, 100 + 10 * static_cast<uint64_t>(step));
    StepMetrics mc = train_step(s.cfg, w_cpu, o_cpu, s.embed, batch, s.vocab, kTtt, kLr, 0.5, *self, sc_cpu);
    // Half of the samples with their tensors already on the GPU (as run_training passes them).
    for (size_t i = 0; i < batch.size(); i += 2) {
      batch[i].aux_hidden = batch[i].aux_hidden.to_device(Device::CUDA);
      batch[i].target_probs = batch[i].target_probs.to_device(Device::CUDA);
    }
    StepMetrics mg = train_step(s.cfg, w_gpu, o_gpu, embed_gpu, batch, s.vocab, kTtt, kLr, 0.5, *self, sc_gpu);
    EXPECT_NEAR(mg.loss(), mc.loss(), 1e-4 * mc.loss()) << "step " << step;
    EXPECT_NEAR(mg.grad_norm, mc.grad_norm, 1e-4 * mc.grad_norm) << "step " << step;
    EXPECT_EQ(mg.valid, mc.valid) << "step " << step;
    EXPECT_EQ(mg.acc_rows, mc.acc_rows) << "step " << step;
    EXPECT_EQ(mg.tokens, mc.tokens);
    EXPECT_EQ(o_gpu.step, o_cpu.step);
  }
  auto wc = w_cpu.named();
  auto wg = w_gpu.named();
  auto w0 = s.w.named();
  double moved = 0;
  for (size_t i = 0; i < wc.size(); ++i) {
    ASSERT_EQ(wg[i].second->device(), Device::CUDA);
    const std::vector<float> g = wg[i].second->to_float_vector(), c = wc[i].second->to_float_vector(),
                             init = w0[i].second->to_float_vector();
    double sum = 0;
    for (size_t j = 0; j < g.size(); ++j) {
      moved = std::max(moved, static_cast<double>(std::fabs(c[j] - init[j])));
      sum += std::fabs(g[j] - c[j]);
    }
    testing::expect_close(g, c, static_cast<float>(3 * kSteps * kLr), 0.0f, wc[i].first);
    EXPECT_LE(sum / static_cast<double>(g.size()), 5e-2 * kSteps * kLr) << wc[i].first;
  }
  EXPECT_GT(moved, 0.5 * kLr) << "the CPU run did not train (the comparison would be empty)";
}

// B samples over the world's ranks (rank r: entries r, r + dp, ...; with B < dp some rank has none and
// queues its all-reduces after its (empty) backward, in the same order), 2 steps.
void nccl_dp_matches_single_rank(int B, DType compute, bool norm_before_fc = false) {
  AERIE_REQUIRE_CUDA();
  auto world = MpiCommunicator::world();
  if (world->size() < 2) GTEST_SKIP() << "needs several ranks (mpirun -np 2)";
  if (local_size() > cuda::device_count()) GTEST_SKIP() << "needs one GPU per rank (NCCL)";
  NcclCommunicator nccl(*world);  // selects this rank's GPU
  auto self = world->split(world->rank(), 0);
  auto s = testing::make_tiny_setup(rank_scratch("train_dp_nccl_B" + std::to_string(B)));
  if (norm_before_fc) testing::enable_norm_before_fc(s, 61);  // input_norm's all-reduce queued last
  std::vector<TTTSample> batch = make_batch(s, B, 21);
  std::vector<TTTSample> mine;
  for (size_t i = static_cast<size_t>(world->rank()); i < batch.size(); i += static_cast<size_t>(world->size()))
    mine.push_back(batch[i]);
  const Tensor embed = s.embed.to_device(Device::CUDA);
  DraftWeights wd = s.w.to_device(Device::CUDA), w1 = s.w.to_device(Device::CUDA);
  AdamState od = AdamState::zeros(s.cfg, Device::CUDA), o1 = AdamState::zeros(s.cfg, Device::CUDA);
  StepScratch sd = StepScratch::zeros(s.cfg, Device::CUDA, compute), s1 = StepScratch::zeros(s.cfg, Device::CUDA, compute);
  constexpr int kSteps = 2;
  constexpr double kLr = 1e-3;
  for (int step = 0; step < kSteps; ++step) {
    StepMetrics md = train_step(s.cfg, wd, od, embed, mine, s.vocab, 4, kLr, 0.5, *world, sd, &nccl);
    StepMetrics m1 = train_step(s.cfg, w1, o1, embed, batch, s.vocab, 4, kLr, 0.5, *self, s1);
    EXPECT_EQ(md.valid, m1.valid);
    EXPECT_EQ(md.tokens, m1.tokens);
    EXPECT_NEAR(md.loss(), m1.loss(), 1e-4 * m1.loss());
    EXPECT_NEAR(md.grad_norm, m1.grad_norm, 1e-4 * m1.grad_norm);
  }
  // The sums differ only in their order (fp32 rounding). fp32 compute: far below 1e-3 lr per element.
  // bf16 compute: a weight that differs in its last fp32 bit may round to another bf16 value in the
  // second step, so as in StepsMatchCpu an element may take another AdamW step (<= ~1.2 lr each).
  auto a = wd.named();
  auto b = w1.named();
  const float tol = compute == DType::F32 ? 1e-3f * kLr : 3.0f * kSteps * kLr;
  for (size_t i = 0; i < a.size(); ++i)
    testing::expect_close(a[i].second->to_float_vector(), b[i].second->to_float_vector(), tol, 0.0f, a[i].first);
  // Every rank holds the same weights.
  Tensor fc = wd.fc.to_device(Device::CPU), sum = fc.clone();
  world->all_reduce_sum(sum);
  std::vector<float> f = fc.to_float_vector(), g = sum.to_float_vector();
  for (size_t i = 0; i < f.size(); ++i) ASSERT_EQ(g[i], f[i] * static_cast<float>(world->size())) << i;
}

TEST(TrainStepDpNccl, OverlappedAllReduceMatchesOneRankF32) {
  auto world = MpiCommunicator::world();
  nccl_dp_matches_single_rank(2 * world->size() + 1, DType::F32);
}

TEST(TrainStepDpNccl, OverlappedAllReduceMatchesOneRankBf16) {
  auto world = MpiCommunicator::world();
  nccl_dp_matches_single_rank(2 * world->size() + 1, DType::BF16);
}

TEST(TrainStepDpNccl, RankWithoutSamples) { nccl_dp_matches_single_rank(1, DType::F32); }

// EAGLE-3.1's norm_before_fc: input_norm's gradient reported final after fc's and all-reduced last.
TEST(TrainStepDpNccl, OverlappedAllReduceWithNormBeforeFc) {
  auto world = MpiCommunicator::world();
  nccl_dp_matches_single_rank(2 * world->size() + 1, DType::BF16, true);
  nccl_dp_matches_single_rank(1, DType::F32, true);
}

TEST(TrainCuda, ResolveDevice) {
  EXPECT_EQ(resolve_train_device("cpu"), Device::CPU);
  EXPECT_EQ(resolve_train_device("auto"), cuda::available() ? Device::CUDA : Device::CPU);
  EXPECT_THROW(resolve_train_device("gpu"), Error);
  if (cuda::available())
    EXPECT_EQ(resolve_train_device("cuda"), Device::CUDA);
  else
    EXPECT_THROW(resolve_train_device("cuda"), Error);
}

}  // namespace
}  // namespace aerie
