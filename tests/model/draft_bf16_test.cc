// bf16 compute of the TTT forward/backward (ttt_forward_backward on a DraftWeights::compute_copy(BF16))
// against the fp32 path on the same draft and sample, on the CPU (every kernel has a bf16 CPU path: this
// runs in CI) and on CUDA (skipped without a GPU); the compute copy itself; and the gradient-ready
// callbacks the data-parallel overlap relies on (each parameter reported once, in
// ttt_gradient_ready_order(cfg), and its gradient no longer changes after the report).
//
// Tolerances of bf16 vs fp32. bf16 keeps 8 significant bits: rounding a GEMM input moves it by at most
// 2^-9 = 0.2% relative. A forward value goes through ~10 roundings per TTT step (norm outputs, q/k/v,
// attention output, MLP activations, the weights) and feeds the next step, and a gradient through as many
// again in the backward; the roundings are independent, so they add like a random walk and partially
// cancel in the GEMMs' fp32 sums. Measured here (CPU, medium draft, T 67, S 7): loss sums within ~2e-3
// relative, gradient tensors within ~1e-2 relative L2 error. The checks allow 2e-2 (loss) and 5e-2
// (gradients, relative L2 per tensor), a margin of ~5x for other shapes and for the CUDA kernels'
// summation order, while an error in the bf16 plumbing (a wrong tensor, a missing term) gives O(1).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>

#include "draft_testing.h"
#include "model/draft.h"
#include "test_util.h"

namespace aerie {
namespace {

constexpr double kLossRtol = 2e-2;
constexpr double kGradRelL2 = 5e-2;

// A draft of several heads per kv head and widths that are not powers of two (head_dim `d`), its
// embedding table rounded to bf16 so that both paths see the same values.
testing::TinyDraft make_draft(uint64_t seed, int64_t d) { return testing::make_medium_draft(seed, d, 512, true); }

// f as extraction stores it: bf16; z of scale 3.
TTTSample make_sample(const testing::TinyDraft& m, int64_t T, uint64_t seed) {
  return testing::make_random_sample(m, T, seed, 3.0, true);
}

double rel_l2(const std::vector<float>& got, const std::vector<float>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    num += (static_cast<double>(got[i]) - ref[i]) * (static_cast<double>(got[i]) - ref[i]);
    den += static_cast<double>(ref[i]) * ref[i];
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

// bf16 compute on `device` against fp32 on the CPU. Prints the largest errors (for the log).
double compare_bf16(const testing::TinyDraft& m, const TTTSample& s, int steps, Device device, const std::string& what) {
  std::vector<double> sw(static_cast<size_t>(steps));
  for (int k = 0; k < steps; ++k) sw[k] = std::pow(0.8, k) / 20.0;
  DraftWeights g_ref = DraftWeights::zeros(m.cfg);
  TTTStats ref = ttt_forward_backward(m.cfg, m.w, m.embed, s, m.d2t, m.t2d, steps, sw, &g_ref);

  const DraftWeights masters = device == Device::CPU ? m.w : m.w.to_device(device);
  const DraftWeights wc = masters.compute_copy(DType::BF16);
  EXPECT_EQ(wc.compute_dtype(), DType::BF16);
  const Tensor embed = device == Device::CPU ? m.embed : m.embed.to_device(device);
  DraftWeights g = DraftWeights::zeros(m.cfg, device);
  TTTStats got = ttt_forward_backward(m.cfg, wc, embed, s, m.d2t, m.t2d, steps, sw, &g);

  int64_t valid = 0;
  double worst_loss = 0;
  for (int k = 0; k < steps; ++k) {
    if (ref.loss_sum[k] != 0) worst_loss = std::max(worst_loss, std::fabs(got.loss_sum[k] / ref.loss_sum[k] - 1));
    EXPECT_NEAR(got.loss_sum[k], ref.loss_sum[k], kLossRtol * std::fabs(ref.loss_sum[k]) + 1e-6) << what << " step " << k;
    EXPECT_EQ(got.valid[k], ref.valid[k]) << what << " step " << k;
    EXPECT_EQ(got.acc_rows[k], ref.acc_rows[k]) << what << " step " << k;
    valid += ref.valid[k];
  }
  EXPECT_GT(valid, 0) << what << ": no valid row (the gradients would be zero)";
  double worst = 0;
  auto gr = g_ref.named();
  auto gg = g.named();
  for (size_t i = 0; i < gr.size(); ++i) {
    EXPECT_EQ(gg[i].second->dtype(), DType::F32) << gr[i].first;
    const std::vector<float> a = gg[i].second->to_float_vector(), b = gr[i].second->to_float_vector();
    const double e = rel_l2(a, b);
    worst = std::max(worst, e);
    EXPECT_LE(e, kGradRelL2) << what << " d" << gr[i].first;
  }
  std::printf("[ bf16 vs fp32 ] %s: worst loss-sum rel error %.3g, worst gradient rel L2 %.3g\n", what.c_str(),
              worst_loss, worst);
  return worst;
}

TEST(DraftBf16, ComputeCopyRoundsMatricesAndSharesNorms) {
  testing::TinyDraft m = make_draft(1, 16);
  DraftWeights c = m.w.compute_copy(DType::BF16);
  auto nm = m.w.named();
  auto nc = c.named();
  for (size_t i = 0; i < nm.size(); ++i) {
    const bool is_norm = nm[i].second->ndim() == 1;
    if (is_norm) {
      EXPECT_EQ(nc[i].second->raw(), nm[i].second->raw()) << nm[i].first << ": norm weights are shared";
      EXPECT_EQ(nc[i].second->dtype(), DType::F32);
      continue;
    }
    EXPECT_EQ(nc[i].second->dtype(), DType::BF16) << nm[i].first;
    const std::vector<float> got = nc[i].second->to_float_vector(), master = nm[i].second->to_float_vector();
    for (size_t j = 0; j < got.size(); ++j) ASSERT_EQ(got[j], round_bf16(master[j])) << nm[i].first << "[" << j << "]";
  }
  // A changed master reaches the copy at the next refresh; a new master object's norms are picked up.
  m.w.q_proj.data<float>()[3] = 0.375f + 1.0f / 1024;
  DraftWeights other = m.w;  // shares the matrices; a norm of its own below
  other.norm = other.norm.clone();
  other.refresh_compute_copy(c);
  EXPECT_EQ(c.q_proj.to_float_vector()[3], round_bf16(0.375f + 1.0f / 1024));
  EXPECT_EQ(c.norm.raw(), other.norm.raw());
  // F32: a copy sharing everything; refresh leaves it alone.
  DraftWeights f = m.w.compute_copy(DType::F32);
  EXPECT_EQ(f.fc.raw(), m.w.fc.raw());
  m.w.refresh_compute_copy(f);
  EXPECT_THROW(m.w.compute_copy(DType::I32), Error);
  EXPECT_THROW(c.compute_copy(DType::BF16), Error);  // masters must be F32
  // norm_before_fc's input_norm is a norm weight: shared, F32, refreshed like the others.
  testing::enable_norm_before_fc(m, 32);
  DraftWeights cn = m.w.compute_copy(DType::BF16);
  ASSERT_EQ(cn.named().size(), 14u);
  EXPECT_EQ(cn.input_norm.raw(), m.w.input_norm.raw());
  EXPECT_EQ(cn.input_norm.dtype(), DType::F32);
  DraftWeights other2 = m.w;
  other2.input_norm = other2.input_norm.clone();
  other2.refresh_compute_copy(cn);
  EXPECT_EQ(cn.input_norm.raw(), other2.input_norm.raw());
}

TEST(DraftBf16, MatchesFp32OnCpu) {
  testing::TinyDraft m = make_draft(3, 16);
  compare_bf16(m, make_sample(m, 67, 4), 7, Device::CPU, "cpu T 67 S 7");
  compare_bf16(m, make_sample(m, 20, 5), 3, Device::CPU, "cpu T 20 S 3");
  m.cfg.norm_before_residual = true;  // the residual base hidden_norm(h) kept in F32 under bf16 compute
  compare_bf16(m, make_sample(m, 67, 4), 7, Device::CPU, "cpu T 67 S 7 norm_before_residual");
  m.cfg.norm_before_residual = false;
  m.cfg.norm_output = true;  // norm(o) handed on in F32 under bf16 compute, its rounding the lm_head's input
  compare_bf16(m, make_sample(m, 67, 4), 7, Device::CPU, "cpu T 67 S 7 norm_output");
  m.cfg.norm_output = false;
  testing::enable_norm_before_fc(m, 31);  // input_norm(f) from the bf16 f, written in bf16 for fc's GEMM
  compare_bf16(m, make_sample(m, 67, 4), 7, Device::CPU, "cpu T 67 S 7 norm_before_fc");
  m.cfg.norm_before_fc = false;
  m.w.input_norm = Tensor();
  testing::enable_fc_norm(m, 32);  // each chunk's norm from the bf16 f, written in bf16 for fc's GEMM
  compare_bf16(m, make_sample(m, 67, 4), 7, Device::CPU, "cpu T 67 S 7 fc_norm");
}

TEST(DraftBf16, MatchesFp32OnCuda) {
  AERIE_REQUIRE_CUDA();
  // d 64 with more than 64 packed rows: the tensor-core attention forward; d 16: the SIMT kernels.
  testing::TinyDraft m = make_draft(6, 64);
  compare_bf16(m, make_sample(m, 150, 7), 7, Device::CUDA, "cuda d 64 T 150 S 7");
  testing::TinyDraft m2 = make_draft(8, 16);
  compare_bf16(m2, make_sample(m2, 67, 9), 7, Device::CUDA, "cuda d 16 T 67 S 7");
  testing::enable_norm_before_fc(m, 33);
  compare_bf16(m, make_sample(m, 150, 7), 7, Device::CUDA, "cuda d 64 T 150 S 7 norm_before_fc");
  m.cfg.norm_before_fc = false;
  m.w.input_norm = Tensor();
  testing::enable_fc_norm(m, 35);
  compare_bf16(m, make_sample(m, 150, 7), 7, Device::CUDA, "cuda d 64 T 150 S 7 fc_norm");
}

// The MLA draft under bf16 compute (the latent, its norm and the rope key in bf16, the attention at
// head dim 192 with the zero-padded values; CUDA: the tensor-core forward at d 192, the SIMT backward).
TEST(DraftBf16, MlaMatchesFp32OnCpu) {
  testing::TinyDraft m = make_draft(21, 16);
  testing::make_mla(m, 24, 32, 16, 8, 12, 22);
  compare_bf16(m, make_sample(m, 67, 23), 7, Device::CPU, "cpu MLA T 67 S 7");
}

TEST(DraftBf16, MlaMatchesFp32OnCuda) {
  AERIE_REQUIRE_CUDA();
  testing::TinyDraft m2 = make_draft(24, 16);
  testing::make_mla(m2, 24, 32, 128, 64, 128, 25);
  compare_bf16(m2, make_sample(m2, 150, 26), 7, Device::CUDA, "cuda MLA d 192 T 150 S 7");
}

// on_grad_ready: each parameter once, in ttt_gradient_ready_order(cfg) (with norm_before_fc's input_norm
// or without), and the gradient reported final
// equals (bitwise) the one at the end of the call. fp32 and bf16 compute, a normal sample and one without
// rows (T 2: everything reported at once).
void check_ready_callbacks(Device device, bool norm_before_fc, bool fc_norm = false) {
  testing::TinyDraft m = make_draft(11, 16);
  if (norm_before_fc) testing::enable_norm_before_fc(m, 34);  // input_norm reported last, after fc
  if (fc_norm) testing::enable_fc_norm(m, 36);  // fc_norm.{0,1,2} reported last, after fc
  const DraftWeights masters = device == Device::CPU ? m.w : m.w.to_device(device);
  const Tensor embed = device == Device::CPU ? m.embed : m.embed.to_device(device);
  for (DType dt : {DType::F32, DType::BF16}) {
    for (int64_t T : {30, 2}) {
      const DraftWeights wc = masters.compute_copy(dt);
      TTTSample s = make_sample(m, T, 12);
      DraftWeights g = DraftWeights::zeros(m.cfg, device);
      auto named = g.named();
      std::vector<int> order;
      std::vector<std::vector<float>> at_report(named.size());
      auto cb = [&](int j) {
        order.push_back(j);
        at_report[static_cast<size_t>(j)] = named[static_cast<size_t>(j)].second->to_float_vector();
      };
      ttt_forward_backward(m.cfg, wc, embed, s, m.d2t, m.t2d, 5, std::vector<double>(5, 0.1), &g, nullptr, cb);
      const std::string what = std::string(dtype_name(dt)) + " T " + std::to_string(T);
      EXPECT_EQ(order, ttt_gradient_ready_order(m.cfg)) << what;
      ASSERT_EQ(order.size(), named.size()) << what;
      for (size_t j = 0; j < named.size(); ++j)
        EXPECT_EQ(at_report[j], named[j].second->to_float_vector()) << what << ": " << named[j].first
                                                                     << " changed after it was reported final";
    }
  }
  // Without gradients nothing is reported.
  int calls = 0;
  ttt_forward_backward(m.cfg, masters, embed, make_sample(m, 30, 12), m.d2t, m.t2d, 5, std::vector<double>(5, 0.1),
                       nullptr, nullptr, [&](int) { ++calls; });
  EXPECT_EQ(calls, 0);
}

TEST(DraftBf16, GradientReadyCallbacksCpu) {
  check_ready_callbacks(Device::CPU, false);
  check_ready_callbacks(Device::CPU, true);
  check_ready_callbacks(Device::CPU, false, true);
}

TEST(DraftBf16, GradientReadyCallbacksCuda) {
  AERIE_REQUIRE_CUDA();
  check_ready_callbacks(Device::CUDA, false);
  check_ready_callbacks(Device::CUDA, true);
  check_ready_callbacks(Device::CUDA, false, true);
}

}  // namespace
}  // namespace aerie
