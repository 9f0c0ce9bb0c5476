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
// Skipped without a GPU.
#include <cmath>

#include "comm/communicator.h"
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
  StepScratch sc_gpu = StepScratch::zeros(s.cfg, Device::CUDA);
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
