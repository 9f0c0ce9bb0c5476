// The TTT forward/backward (ttt_forward_backward) on CUDA against the CPU run of the same draft and
// sample: loss sums, valid/acc counts, the step logits and every weight gradient. Both compute in fp32
// (cuBLASLt without TF32, fp32 kernels); they differ only in the order of fp32 sums, which changes
// results by a few ulp per op. Through a few TTT steps (each feeding the next), softmax and the
// backward, that stays well below 1e-4 relative (measured in kernels tests: ~1e-6 per op), so:
//  - loss sums: 1e-4 relative;
//  - a gradient tensor: elementwise |g_gpu - g_cpu| <= 1e-4 max|g_cpu| + 1e-3 |g_cpu| (small entries
//    are sums of cancelling terms whose rounding scales with the tensor's magnitude, not their own).
// Skipped without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "draft_testing.h"
#include "model/draft.h"
#include "test_util.h"

namespace aerie {
namespace {

TTTSample make_sample(const testing::TinyDraft& m, int64_t T, uint64_t seed) {
  return testing::make_random_sample(m, T, seed, 1.0, false);
}

// any_valid: the sample has valid rows, so the gradients are non-zero; without any (T = 2: no row has
// t + k + 2 <= T - 1) both devices must give exactly zero.
void expect_grad_close(const Tensor& got, const Tensor& ref, const std::string& what, bool any_valid) {
  const std::vector<float> g = got.to_float_vector(), r = ref.to_float_vector();
  float mx = 0;
  for (float v : r) mx = std::max(mx, std::fabs(v));
  if (!any_valid) {
    EXPECT_EQ(mx, 0.0f) << what << ": a sample without valid rows has a non-zero CPU gradient";
    EXPECT_EQ(g, std::vector<float>(g.size(), 0.0f)) << what << ": non-zero CUDA gradient without valid rows";
    return;
  }
  EXPECT_GT(mx, 0.0f) << what << ": the CPU gradient is all zero (the test would check nothing)";
  testing::expect_close(g, r, 1e-4f * mx, 1e-3f, what);
}

void compare(const testing::TinyDraft& m, const TTTSample& s, int steps, const std::string& what) {
  std::vector<double> sw(static_cast<size_t>(steps));
  for (int k = 0; k < steps; ++k) sw[k] = std::pow(0.8, k) / 7.0;
  DraftWeights g_cpu = DraftWeights::zeros(m.cfg);
  std::vector<Tensor> logits_cpu, logits_gpu;
  TTTStats cpu = ttt_forward_backward(m.cfg, m.w, m.embed, s, m.d2t, m.t2d, steps, sw, &g_cpu, &logits_cpu);

  const DraftWeights w_gpu = m.w.to_device(Device::CUDA);
  const Tensor embed_gpu = m.embed.to_device(Device::CUDA);
  DraftWeights g_gpu = DraftWeights::zeros(m.cfg, Device::CUDA);
  TTTStats gpu = ttt_forward_backward(m.cfg, w_gpu, embed_gpu, s, m.d2t, m.t2d, steps, sw, &g_gpu, &logits_gpu);

  for (int k = 0; k < steps; ++k) {
    EXPECT_NEAR(gpu.loss_sum[k], cpu.loss_sum[k], 1e-4 * std::fabs(cpu.loss_sum[k]) + 1e-6) << what << " step " << k;
    EXPECT_EQ(gpu.valid[k], cpu.valid[k]) << what << " step " << k;
    EXPECT_EQ(gpu.acc_rows[k], cpu.acc_rows[k]) << what << " step " << k;
    EXPECT_EQ(gpu.correct[k], cpu.correct[k]) << what << " step " << k;
    ASSERT_EQ(logits_gpu[k].shape(), logits_cpu[k].shape()) << what << " step " << k;
    EXPECT_EQ(logits_gpu[k].device(), Device::CUDA);
    testing::expect_close(logits_gpu[k].to_float_vector(), logits_cpu[k].to_float_vector(), 1e-4f, 1e-4f,
                          what + " logits step " + std::to_string(k));
  }
  int64_t valid = 0;
  for (int k = 0; k < steps; ++k) valid += cpu.valid[k];
  auto gc = g_cpu.named();
  auto gg = g_gpu.named();
  for (size_t i = 0; i < gc.size(); ++i) {
    EXPECT_EQ(gg[i].second->device(), Device::CUDA);
    expect_grad_close(*gg[i].second, *gc[i].second, what + " d" + gc[i].first, valid > 0);
  }
}

TEST(DraftCuda, TTTForwardBackwardMatchesCpuTiny) {
  AERIE_REQUIRE_CUDA();
  testing::TinyDraft m = testing::make_tiny_draft(3);
  compare(m, testing::make_tiny_sample(m, 13, 4), 4, "tiny T 13 S 4");
  compare(m, testing::make_tiny_sample(m, 5, 5), 7, "tiny T 5 S 7 (steps without rows)");
}

TEST(DraftCuda, TTTForwardBackwardMatchesCpuMedium) {
  AERIE_REQUIRE_CUDA();
  testing::TinyDraft m = testing::make_medium_draft(8, 16, 256, false);
  compare(m, make_sample(m, 67, 9), 7, "medium T 67 S 7");
  compare(m, make_sample(m, 2, 10), 3, "medium T 2 S 3");
  m.cfg.norm_before_residual = true;
  compare(m, make_sample(m, 67, 9), 7, "medium T 67 S 7 norm_before_residual");
  m.cfg.norm_before_residual = false;
  m.cfg.norm_output = true;
  compare(m, make_sample(m, 67, 9), 7, "medium T 67 S 7 norm_output");
  m.cfg.norm_output = false;
  testing::enable_norm_before_fc(m, 14);  // input_norm [3 H_t] on the GPU: its forward and weight gradient
  compare(m, make_sample(m, 67, 9), 7, "medium T 67 S 7 norm_before_fc");
  {  // fc_norm's three per-chunk norms on the GPU (column copies, forward and weight gradients)
    testing::TinyDraft mf = m;
    mf.cfg.norm_before_fc = false;
    mf.w.input_norm = Tensor();
    testing::enable_fc_norm(mf, 15);
    compare(mf, make_sample(mf, 67, 9), 7, "medium T 67 S 7 fc_norm");
  }
  m.cfg.sliding_window = 20;  // the window's lower bound in the GPU forward and both backward passes
  compare(m, make_sample(m, 67, 9), 7, "medium T 67 S 7 sliding window 20");
}

// The MLA draft at DeepSeek-V3's head widths (query/key head 128 + 64 = 192, value head 128 zero-padded to
// it): the attention forward, backward and diagonal merge at head dim 192 on the GPU (fp32), the latent
// norms, the shared rope key and its sum over the heads.
TEST(DraftCuda, MlaTTTForwardBackwardMatchesCpu) {
  AERIE_REQUIRE_CUDA();
  testing::TinyDraft m = testing::make_medium_draft(8, 16, 256, false);
  testing::make_mla(m, 24, 32, 128, 64, 128, 9);
  compare(m, make_sample(m, 67, 9), 7, "MLA medium T 67 S 7");
  testing::make_mla(m, 0, 32, 128, 64, 128, 10);
  compare(m, make_sample(m, 40, 11), 3, "MLA medium q_proj T 40 S 3");
}

/// Decoding on the GPU against the CPU: 30 verified rows appended to both caches, then a chain of 5 (the
/// proposals and their logits) and a tree of 8 nodes (the same tokens and parents).
void expect_decoder_matches_cpu(const testing::TinyDraft& m, uint64_t sample_seed) {
  const TTTSample s = make_sample(m, 40, sample_seed);
  const DraftWeights w_gpu = m.w.to_device(Device::CUDA);
  const Tensor embed_gpu = m.embed.to_device(Device::CUDA);
  DraftDecoder cpu(m.cfg, m.w, m.embed, m.d2t, 64), gpu(m.cfg, w_gpu, embed_gpu, m.d2t, 64);
  const std::vector<int32_t> next(s.ids.begin() + 1, s.ids.begin() + 31);
  cpu.append_verified(s.aux_hidden.slice(0, 30), next);
  gpu.append_verified(s.aux_hidden.slice(0, 30), next);
  std::vector<std::vector<float>> lc, lg;
  const std::vector<int32_t> gc = cpu.propose(5, &lc), gg = gpu.propose(5, &lg);
  EXPECT_EQ(gg, gc);
  ASSERT_EQ(lg.size(), lc.size());
  for (size_t k = 0; k < lc.size(); ++k) testing::expect_close(lg[k], lc[k], 1e-4f, 1e-4f, "step " + std::to_string(k));
  const DraftTree tc = cpu.propose_tree(8, 3, 4), tg = gpu.propose_tree(8, 3, 4);
  EXPECT_EQ(tg.tokens, tc.tokens);
  EXPECT_EQ(tg.parent, tc.parent);
}

// The MLA draft decoding on the GPU (eval's draft): the cache of expanded keys at head dim 192, one-row
// attention and the chain's diagonal merge there give the CPU's chain and logits, and the same tree.
TEST(DraftCuda, MlaDecoderMatchesCpu) {
  AERIE_REQUIRE_CUDA();
  testing::TinyDraft m = testing::make_medium_draft(15, 16, 256, false);
  testing::make_mla(m, 24, 32, 128, 64, 128, 16);
  expect_decoder_matches_cpu(m, 17);
}

// A sliding window in decoding on the GPU: the prefill of 30 cached rows and the chain see their last 7
// keys, as on the CPU (the chain's proposals and logits, and a tree).
TEST(DraftCuda, SlidingWindowDecoderMatchesCpu) {
  AERIE_REQUIRE_CUDA();
  testing::TinyDraft m = testing::make_medium_draft(18, 16, 256, false);
  m.cfg.sliding_window = 7;
  expect_decoder_matches_cpu(m, 19);
}

// Gradients are ADDED to: a second call doubles them on CUDA as on the CPU; no gradient: the same loss.
TEST(DraftCuda, GradientsAccumulateAndForwardOnly) {
  AERIE_REQUIRE_CUDA();
  testing::TinyDraft m = testing::make_medium_draft(12, 16, 256, false);
  TTTSample s = make_sample(m, 20, 13);
  const std::vector<double> sw(3, 0.1);
  const DraftWeights w_gpu = m.w.to_device(Device::CUDA);
  const Tensor embed_gpu = m.embed.to_device(Device::CUDA);
  DraftWeights g1 = DraftWeights::zeros(m.cfg, Device::CUDA), g2 = DraftWeights::zeros(m.cfg, Device::CUDA);
  TTTStats a = ttt_forward_backward(m.cfg, w_gpu, embed_gpu, s, m.d2t, m.t2d, 3, sw, &g1);
  ttt_forward_backward(m.cfg, w_gpu, embed_gpu, s, m.d2t, m.t2d, 3, sw, &g2);
  ttt_forward_backward(m.cfg, w_gpu, embed_gpu, s, m.d2t, m.t2d, 3, sw, &g2);
  auto n1 = g1.named();
  auto n2 = g2.named();
  for (size_t i = 0; i < n1.size(); ++i) {
    std::vector<float> twice = n1[i].second->to_float_vector();
    for (float& v : twice) v *= 2;
    testing::expect_close(n2[i].second->to_float_vector(), twice, 1e-6f, 1e-5f, n1[i].first);
  }
  TTTStats b = ttt_forward_backward(m.cfg, w_gpu, embed_gpu, s, m.d2t, m.t2d, 3, sw, nullptr);
  for (int k = 0; k < 3; ++k) EXPECT_NEAR(a.loss_sum[k], b.loss_sum[k], 1e-6 * std::fabs(a.loss_sum[k]));
}

}  // namespace
}  // namespace aerie
