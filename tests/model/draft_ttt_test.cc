// TTT forward/backward (eagle3.md sections 3-4) against an independent double reference with
// materialised masks, finite-difference gradients of every weight tensor, the TTT attention against an
// explicit masked softmax, causality at the sample end, and the traps of section 4.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <functional>
#include <random>

#include "draft_testing.h"
#include "model/draft.h"
#include "model/draft_layer.h"
#include "test_util.h"

namespace aerie {
namespace {

using testing::make_tiny_draft;
using testing::make_tiny_sample;
using testing::reference_ttt;
using testing::to_double;

constexpr int kSteps = 3;
const std::vector<double> kWeights = {1.0, 0.8, 0.64};

double total_loss(const TTTStats& st, const std::vector<double>& sw) {
  double l = 0;
  for (size_t k = 0; k < st.loss_sum.size(); ++k) l += sw[k] * st.loss_sum[k];
  return l;
}

void forward_matches_double_reference(bool norm_before_residual, bool norm_output = false,
                                      bool norm_before_fc = false, int64_t sliding_window = 0, bool fc_norm = false) {
  auto m = make_tiny_draft(1);
  m.cfg.norm_before_residual = norm_before_residual;
  m.cfg.norm_output = norm_output;
  m.cfg.sliding_window = sliding_window;
  if (norm_before_fc) testing::enable_norm_before_fc(m, 21);
  if (fc_norm) testing::enable_fc_norm(m, 22);
  auto s = make_tiny_sample(m, 9, 2);
  std::vector<Tensor> logits;
  TTTStats st = ttt_forward_backward(m.cfg, m.w, m.embed, s, m.d2t, m.t2d, kSteps, kWeights, nullptr, &logits);
  auto ref = reference_ttt(m.cfg, to_double(m.w), m.embed, s, m.t2d, kSteps, kWeights);
  ASSERT_EQ(logits.size(), 3u);
  for (int k = 0; k < kSteps; ++k) {
    ASSERT_EQ(logits[k].dim(0), 9 - 1 - k) << "step " << k << " computes the rows whose input token exists";
    ASSERT_EQ(ref.logits[k].size(), static_cast<size_t>(9 - 1 - k));
    std::vector<float> want;
    for (auto& row : ref.logits[k]) want.insert(want.end(), row.begin(), row.end());
    // fp32 forward vs double reference: a few ulps of accumulated rounding.
    testing::expect_close(logits[k].to_float_vector(), want, 2e-5f, 2e-5f, "logits step " + std::to_string(k));
    EXPECT_NEAR(st.loss_sum[k], ref.loss_sum[k], 1e-5 * (1 + std::fabs(ref.loss_sum[k]))) << "step " << k;
    // Metrics by the formulas of section 4, counted here from the reference logits.
    int64_t valid = 0, acc_rows = 0, correct = 0;
    for (int64_t t = 0; t + k + 2 <= 8; ++t) {
      if (!s.loss_mask[t + k + 2]) continue;
      ++acc_rows;
      if (m.t2d[s.target_argmax[t + k + 1]]) ++valid;
      auto& row = ref.logits[k][t];
      int64_t am = std::max_element(row.begin(), row.end()) - row.begin();
      if (m.selected[am] == s.target_argmax[t + k + 1]) ++correct;
    }
    EXPECT_EQ(st.valid[k], valid);
    EXPECT_EQ(st.acc_rows[k], acc_rows);
    EXPECT_EQ(st.correct[k], correct);
  }
  EXPECT_EQ(ttt_valid_counts(s, m.t2d, kSteps), st.valid);
  // The sample must exercise every branch of valid: masked rows and unselected target argmaxes.
  int unselected = 0;
  for (int64_t t = 1; t < 8; ++t) unselected += !m.t2d[s.target_argmax[t]];
  EXPECT_GT(unselected, 0);
  EXPECT_GT(st.valid[0], 0);
}

TEST(DraftTTT, ForwardMatchesDoubleReference) { forward_matches_double_reference(false); }

// Every weight tensor: analytic gradient (fp32) vs central finite differences of the double reference
// loss sum_k w_k loss_sum_k (eps 1e-5; truncation error ~1e-10), on a random subset of entries.
void gradient_matches_finite_differences_of_reference(bool norm_before_residual, bool norm_output = false,
                                                      bool norm_before_fc = false, int64_t sliding_window = 0,
                                                      bool fc_norm = false) {
  auto m = make_tiny_draft(3);
  m.cfg.norm_before_residual = norm_before_residual;
  m.cfg.norm_output = norm_output;
  m.cfg.sliding_window = sliding_window;
  if (norm_before_fc) testing::enable_norm_before_fc(m, 23);
  if (fc_norm) testing::enable_fc_norm(m, 24);
  auto s = make_tiny_sample(m, 9, 4);
  DraftWeights g = DraftWeights::zeros(m.cfg);
  ttt_forward_backward(m.cfg, m.w, m.embed, s, m.d2t, m.t2d, kSteps, kWeights, &g);
  auto W = to_double(m.w);
  auto named_g = g.named();
  EXPECT_EQ(named_g.size(), 13u + (norm_before_fc ? 1u : 0u) + (fc_norm ? 3u : 0u))
      << "input_norm.weight is a parameter exactly with norm_before_fc, fc_norm.{0,1,2}.weight with fc_norm";
  std::mt19937_64 rng(5);
  double worst = 0;  // |analytic - FD| / (1 + max |gradient of the tensor|), for the log
  std::string worst_at;
  for (size_t ti = 0; ti < W.size(); ++ti) {
    const std::string& name = named_g[ti].first;
    std::vector<float> ga = named_g[ti].second->to_float_vector();
    double max_abs = 0;
    for (float v : ga) max_abs = std::max(max_abs, static_cast<double>(std::fabs(v)));
    EXPECT_GT(max_abs, 1e-4) << name << ": gradient is all zero";
    const int picks = std::min<int>(10, static_cast<int>(W[ti].size()));
    for (int p = 0; p < picks; ++p) {
      const size_t i = rng() % W[ti].size();
      const double e = 1e-5, orig = W[ti][i];
      W[ti][i] = orig + e;
      double lp = reference_ttt(m.cfg, W, m.embed, s, m.t2d, kSteps, kWeights).total;
      W[ti][i] = orig - e;
      double lm = reference_ttt(m.cfg, W, m.embed, s, m.t2d, kSteps, kWeights).total;
      W[ti][i] = orig;
      const double fd = (lp - lm) / (2 * e);
      // fp32 backward vs double FD: 1e-4 relative to the tensor's scale covers fp32 rounding.
      EXPECT_NEAR(ga[i], fd, 1e-4 * (1 + max_abs) + 1e-3 * std::fabs(fd)) << name << "[" << i << "]";
      const double err = std::fabs(ga[i] - fd) / (1 + max_abs);
      if (err > worst) worst = err, worst_at = name;
    }
  }
  std::printf("[ double ref ] norm_before_residual %d norm_output %d norm_before_fc %d sliding_window %lld fc_norm %d: "
              "worst gradient error %.3g (%s), relative to 1 + the tensor's max |gradient|\n",
              norm_before_residual, norm_output, norm_before_fc, static_cast<long long>(sliding_window), fc_norm,
              worst, worst_at.c_str());
}

TEST(DraftTTT, GradientMatchesFiniteDifferencesOfReference) { gradient_matches_finite_differences_of_reference(false); }

/// The error ttt_forward_backward throws for the tiny draft m on a sample of 9 tokens ("" when none).
std::string ttt_error(const testing::TinyDraft& m) {
  const auto s = make_tiny_sample(m, 9, 2);
  return testing::error_of([&] { ttt_forward_backward(m.cfg, m.w, m.embed, s, m.d2t, m.t2d, kSteps, kWeights, nullptr); });
}

/// The TTT loss of the tiny draft changes by more than fp32 noise when `set` turns an option on (so that
/// neither the forward nor its reference can ignore it).
void expect_option_changes_loss(const std::function<void(testing::TinyDraft&)>& set) {
  auto m = make_tiny_draft(1);
  auto s = make_tiny_sample(m, 9, 2);
  const TTTStats off = ttt_forward_backward(m.cfg, m.w, m.embed, s, m.d2t, m.t2d, kSteps, kWeights, nullptr);
  set(m);
  const TTTStats on = ttt_forward_backward(m.cfg, m.w, m.embed, s, m.d2t, m.t2d, kSteps, kWeights, nullptr);
  EXPECT_GT(std::fabs(total_loss(on, kWeights) - total_loss(off, kWeights)), 1e-5 * std::fabs(total_loss(off, kWeights)));
}

// EAGLE-3.1's norm_before_residual (y = hidden_norm(h) + o_proj(attention)): the forward against the
// double reference with the option, every weight's gradient against its finite differences, and the
// option changing the loss (so that neither side can ignore it).
TEST(DraftTTT, NormBeforeResidualMatchesTheReference) {
  forward_matches_double_reference(true);
  gradient_matches_finite_differences_of_reference(true);
  // (0.06% on this draft, whose hidden states are near unit RMS; fp32 noise is ~1e-7.)
  expect_option_changes_loss([](testing::TinyDraft& m) { m.cfg.norm_before_residual = true; });
}

// EAGLE-3.1's norm_output (each step hands norm(o) to the next): the same three checks, alone and with
// norm_before_residual (vLLM, SGLang and speculators allow both at once).
TEST(DraftTTT, NormOutputMatchesTheReference) {
  forward_matches_double_reference(false, true);
  gradient_matches_finite_differences_of_reference(false, true);
  forward_matches_double_reference(true, true);
  gradient_matches_finite_differences_of_reference(true, true);
  expect_option_changes_loss([](testing::TinyDraft& m) { m.cfg.norm_output = true; });
}

// EAGLE-3.1's norm_before_fc (g = fc(input_norm(f)), a new trained weight input_norm [3 H_t]): the forward
// against the double reference, every weight's gradient (input_norm's among them) against the finite
// differences of the reference, alone and with both other options (vLLM and SGLang read all three at
// once), and the option changing the loss with input_norm at its initial ones.
TEST(DraftTTT, NormBeforeFcMatchesTheReference) {
  forward_matches_double_reference(false, false, true);
  gradient_matches_finite_differences_of_reference(false, false, true);
  forward_matches_double_reference(true, true, true);
  gradient_matches_finite_differences_of_reference(true, true, true);
  expect_option_changes_loss([](testing::TinyDraft& m) {
    m.cfg.norm_before_fc = true;
    m.w.input_norm = Tensor::empty({3 * m.cfg.target_hidden_size}, DType::F32);
    for (int64_t i = 0; i < m.w.input_norm.numel(); ++i) m.w.input_norm.data<float>()[i] = 1.0f;
  });
  // init_draft_weights: input_norm exactly when the option is on, all ones, the other weights unchanged
  // (the same random draws as without the option).
  auto plain = make_tiny_draft(5);
  DraftConfig c = plain.cfg;
  c.norm_before_fc = true;
  const DraftWeights w = init_draft_weights(c, plain.target_lm, plain.selected, 6);
  const DraftWeights w0 = init_draft_weights(plain.cfg, plain.target_lm, plain.selected, 6);
  EXPECT_FALSE(w0.input_norm.defined());
  ASSERT_TRUE(w.input_norm.defined());
  EXPECT_EQ(w.input_norm.shape(), (Shape{3 * c.target_hidden_size}));
  for (float v : w.input_norm.to_float_vector()) EXPECT_EQ(v, 1.0f);
  EXPECT_EQ(w.fc.to_float_vector(), w0.fc.to_float_vector());
  EXPECT_EQ(w.lm_head.to_float_vector(), w0.lm_head.to_float_vector());
  // A draft with the option but without the weight, or with the weight but without the option, is refused
  // by name.
  auto m = make_tiny_draft(1);
  m.cfg.norm_before_fc = true;
  EXPECT_NE(ttt_error(m).find("input_norm"), std::string::npos);
  testing::enable_norm_before_fc(m, 25);
  m.cfg.norm_before_fc = false;
  EXPECT_NE(ttt_error(m).find("norm_before_fc is off"), std::string::npos);
}

// EAGLE-3.1's fc_norm (g = fc(concat_k fc_norm.k(f_k)), three trained weights fc_norm.k [H_t]): the forward
// against the double reference, every weight's gradient (the three norms' among them) against the finite
// differences of the reference, alone and with norm_before_residual and norm_output, the option changing
// the loss at its initial ones, init_draft_weights' ones, and the refusals by name (the option without the
// weights, the weights without the option, the option with norm_before_fc in a config).
TEST(DraftTTT, FcNormMatchesTheReference) {
  forward_matches_double_reference(false, false, false, 0, true);
  gradient_matches_finite_differences_of_reference(false, false, false, 0, true);
  forward_matches_double_reference(true, true, false, 0, true);
  gradient_matches_finite_differences_of_reference(true, true, false, 0, true);
  expect_option_changes_loss([](testing::TinyDraft& m) {
    m.cfg.fc_norm = true;
    for (Tensor& t : m.w.fc_norm) {
      t = Tensor::empty({m.cfg.target_hidden_size}, DType::F32);
      for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = 1.0f;
    }
  });
  auto plain = make_tiny_draft(5);
  DraftConfig c = plain.cfg;
  c.fc_norm = true;
  const DraftWeights w = init_draft_weights(c, plain.target_lm, plain.selected, 6);
  const DraftWeights w0 = init_draft_weights(plain.cfg, plain.target_lm, plain.selected, 6);
  EXPECT_FALSE(w0.fc_norm[0].defined());
  for (const Tensor& t : w.fc_norm) {
    ASSERT_TRUE(t.defined());
    EXPECT_EQ(t.shape(), (Shape{c.target_hidden_size}));
    for (float v : t.to_float_vector()) EXPECT_EQ(v, 1.0f);
  }
  EXPECT_EQ(w.fc.to_float_vector(), w0.fc.to_float_vector());
  const std::vector<std::string> names = DraftWeights::names(c);
  ASSERT_EQ(names.size(), 16u);
  EXPECT_EQ(names[13], "fc_norm.0.weight");
  EXPECT_EQ(names[15], "fc_norm.2.weight");
  auto m = make_tiny_draft(1);
  m.cfg.fc_norm = true;
  EXPECT_NE(ttt_error(m).find("fc_norm.0.weight"), std::string::npos);
  testing::enable_fc_norm(m, 26);
  m.cfg.fc_norm = false;
  EXPECT_NE(ttt_error(m).find("fc_norm is off"), std::string::npos);
}

// The same in fp32 through ttt_forward_backward itself (the whole TTT loss), eps 1e-2 relative to
// the entry (min 1e-3): central differences in fp32 carry ~1e-7 * |L| / eps of rounding noise.
TEST(DraftTTT, GradientMatchesFiniteDifferencesFp32) {
  auto m = make_tiny_draft(7);
  auto s = make_tiny_sample(m, 9, 8);
  DraftWeights g = DraftWeights::zeros(m.cfg);
  TTTStats st0 = ttt_forward_backward(m.cfg, m.w, m.embed, s, m.d2t, m.t2d, kSteps, kWeights, &g);
  const double L = total_loss(st0, kWeights);
  auto named_w = m.w.named();
  auto named_g = g.named();
  std::mt19937_64 rng(9);
  for (size_t ti = 0; ti < named_w.size(); ++ti) {
    Tensor& w = *named_w[ti].second;
    std::vector<float> ga = named_g[ti].second->to_float_vector();
    for (int p = 0; p < 4; ++p) {
      const int64_t i = static_cast<int64_t>(rng() % w.numel());
      float* x = w.data<float>() + i;
      const float orig = *x, e = std::max(1e-3f, 1e-2f * std::fabs(orig));
      *x = orig + e;
      double lp = total_loss(ttt_forward_backward(m.cfg, m.w, m.embed, s, m.d2t, m.t2d, kSteps, kWeights, nullptr),
                             kWeights);
      *x = orig - e;
      double lm = total_loss(ttt_forward_backward(m.cfg, m.w, m.embed, s, m.d2t, m.t2d, kSteps, kWeights, nullptr),
                             kWeights);
      *x = orig;
      const double fd = (lp - lm) / (2.0 * (static_cast<double>(orig + e) - orig));
      const double noise = 1e-6 * (1 + std::fabs(L)) / e;  // fp32 rounding of L over the step
      EXPECT_NEAR(ga[i], fd, 3 * noise + 2e-3 + 2e-2 * std::fabs(fd)) << named_w[ti].first << "[" << i << "]";
    }
  }
}

// Gradients ADD into *grads (so a trainer can accumulate over samples).
TEST(DraftTTT, GradientsAccumulate) {
  auto m = make_tiny_draft(11);
  auto s = make_tiny_sample(m, 7, 12);
  DraftWeights g1 = DraftWeights::zeros(m.cfg), g2 = DraftWeights::zeros(m.cfg);
  ttt_forward_backward(m.cfg, m.w, m.embed, s, m.d2t, m.t2d, kSteps, kWeights, &g1);
  ttt_forward_backward(m.cfg, m.w, m.embed, s, m.d2t, m.t2d, kSteps, kWeights, &g2);
  ttt_forward_backward(m.cfg, m.w, m.embed, s, m.d2t, m.t2d, kSteps, kWeights, &g2);
  auto a = g1.named(), b = g2.named();
  for (size_t i = 0; i < a.size(); ++i) {
    std::vector<float> x = a[i].second->to_float_vector(), y = b[i].second->to_float_vector();
    for (float& v : x) v *= 2;
    testing::expect_close(y, x, 1e-6f, 1e-5f, a[i].first);
  }
}

// The TTT attention against an explicit masked softmax (a materialised [rows, keys] mask).
// The sliding window (each row sees its last W step-0 keys and all its own diagonal keys): the forward
// against the double reference's masks, every weight's gradient against its finite differences, at
// windows of 3 (the 9-token sample's later rows lose keys) and 1 (step 0 sees its own key only); a window
// as long as the sample changes nothing, a short one changes the loss.
TEST(DraftTTT, SlidingWindowMatchesTheReference) {
  forward_matches_double_reference(false, false, false, 3);
  gradient_matches_finite_differences_of_reference(false, false, false, 3);
  forward_matches_double_reference(true, true, false, 1);
  gradient_matches_finite_differences_of_reference(false, false, false, 1);
  expect_option_changes_loss([](testing::TinyDraft& m) { m.cfg.sliding_window = 3; });
  auto m = make_tiny_draft(1);
  auto s = make_tiny_sample(m, 9, 2);
  const TTTStats full = ttt_forward_backward(m.cfg, m.w, m.embed, s, m.d2t, m.t2d, kSteps, kWeights, nullptr);
  m.cfg.sliding_window = 9;
  const TTTStats wide = ttt_forward_backward(m.cfg, m.w, m.embed, s, m.d2t, m.t2d, kSteps, kWeights, nullptr);
  EXPECT_EQ(total_loss(wide, kWeights), total_loss(full, kWeights)) << "a window over the whole sample is causal";
}

TEST(DraftTTT, AttentionEqualsExplicitMaskedSoftmax) {
  std::mt19937_64 rng(13);
  const int64_t n = 6, nh = 4, nkv = 2, d = 8, J = 3;
  const float scale = 1.0f / std::sqrt(8.0f);
  Tensor q = testing::random_tensor({n, nh, d}, rng, 1.0), k0 = testing::random_tensor({n, nkv, d}, rng, 1.0),
         v0 = testing::random_tensor({n, nkv, d}, rng, 1.0);
  std::vector<Tensor> dk, dv;
  std::vector<const Tensor*> pk, pv;
  for (int j = 0; j < J; ++j) {
    dk.push_back(testing::random_tensor({n + 2, nkv, d}, rng, 1.0));  // more rows than queries: must be ignored
    dv.push_back(testing::random_tensor({n + 2, nkv, d}, rng, 1.0));
  }
  for (int j = 0; j < J; ++j) {
    pk.push_back(&dk[j]);
    pv.push_back(&dv[j]);
  }
  Tensor out = Tensor::empty({n, nh, d}, DType::F32), lse = Tensor::empty({n, nh}, DType::F32);
  draft_detail::ttt_attention_forward(q, k0, v0, pk, pv, 0, scale, 0, out, lse);
  // All keys in one list: index c < n is step-0 row c, index n + j*(n+2) + r is diagonal j row r.
  std::vector<float> want_out, want_lse;
  for (int64_t i = 0; i < n; ++i)
    for (int64_t h = 0; h < nh; ++h) {
      const int64_t kh = h / (nh / nkv);
      std::vector<double> sc;
      std::vector<const float*> vs;
      for (int64_t c = 0; c < n + J * (n + 2); ++c) {
        const bool step0 = c < n;
        const int64_t j = step0 ? -1 : (c - n) / (n + 2), r = step0 ? c : (c - n) % (n + 2);
        const bool mask = step0 ? r <= i : r == i;
        if (!mask) continue;
        const float* kp = (step0 ? k0 : dk[j]).data<float>() + (r * nkv + kh) * d;
        double dd = 0;
        for (int64_t x = 0; x < d; ++x) dd += q.data<float>()[(i * nh + h) * d + x] * kp[x];
        sc.push_back(scale * dd);
        vs.push_back((step0 ? v0 : dv[j]).data<float>() + (r * nkv + kh) * d);
      }
      double mx = -1e300, z = 0;
      for (double v : sc) mx = std::max(mx, v);
      for (double v : sc) z += std::exp(v - mx);
      for (int64_t x = 0; x < d; ++x) {
        double o = 0;
        for (size_t c = 0; c < sc.size(); ++c) o += std::exp(sc[c] - mx) / z * vs[c][x];
        want_out.push_back(static_cast<float>(o));
      }
      want_lse.push_back(static_cast<float>(mx + std::log(z)));
    }
  testing::expect_close(out.to_float_vector(), want_out, 1e-5f, 1e-5f, "ttt attention out");
  testing::expect_close(lse.to_float_vector(), want_lse, 1e-5f, 1e-5f, "ttt attention lse");
}

// Rows never look past their own position: a sample extended by more tokens gives the same logits
// for every (step, row) of the shorter one, and the short sample's step k has exactly T-1-k rows.
TEST(DraftTTT, RowsNeverLookPastTheSample) {
  auto m = make_tiny_draft(17);
  auto lng = make_tiny_sample(m, 12, 18);
  const int64_t T = 8;
  std::vector<int32_t> ids(lng.ids.begin(), lng.ids.begin() + T);
  std::vector<uint8_t> mask(lng.loss_mask.begin(), lng.loss_mask.begin() + T);
  TTTSample sh;
  sh.ids = ids;
  sh.loss_mask = mask;
  sh.aux_hidden = lng.aux_hidden.slice(0, T).clone();
  sh.target_probs = lng.target_probs.slice(0, T).clone();
  sh.target_argmax.assign(lng.target_argmax.begin(), lng.target_argmax.begin() + T);
  std::vector<Tensor> ls, ll;
  ttt_forward_backward(m.cfg, m.w, m.embed, sh, m.d2t, m.t2d, 4, {1, 1, 1, 1}, nullptr, &ls);
  ttt_forward_backward(m.cfg, m.w, m.embed, lng, m.d2t, m.t2d, 4, {1, 1, 1, 1}, nullptr, &ll);
  for (int k = 0; k < 4; ++k) {
    ASSERT_EQ(ls[k].dim(0), T - 1 - k);
    std::vector<float> a = ls[k].to_float_vector(), b = ll[k].slice(0, T - 1 - k).to_float_vector();
    testing::expect_close(a, b, 1e-6f, 1e-6f, "step " + std::to_string(k));
  }
}

// Trap (SpecForge #885): the loss mask shifts with the tokens. With m = 1 only at position p, step k
// supervises exactly row t = p - k - 2 against target_probs[p - 1]; no other target row matters.
TEST(DraftTTT, LossMaskShiftsWithTheTokens) {
  auto m = make_tiny_draft(19);
  auto s = make_tiny_sample(m, 9, 20);
  const int64_t p = 6;
  for (int64_t t = 0; t < 9; ++t) {
    s.loss_mask[t] = t == p;
    s.target_argmax[t] = m.selected[t % 10];  // every argmax selected
  }
  auto st = ttt_forward_backward(m.cfg, m.w, m.embed, s, m.d2t, m.t2d, kSteps, kWeights, nullptr);
  for (int k = 0; k < kSteps; ++k) {
    EXPECT_EQ(st.valid[k], 1) << "step " << k;
    EXPECT_EQ(st.acc_rows[k], 1) << "step " << k;
  }
  auto st_other = st;
  TTTSample s2 = s;
  s2.target_probs = s.target_probs.clone();
  for (int64_t r = 0; r < 9; ++r) {
    if (r == p - 1) continue;
    float* q = s2.target_probs.data<float>() + r * 10;
    std::fill(q, q + 10, 0.0f);
    q[r % 10] = 1.0f;
  }
  st_other = ttt_forward_backward(m.cfg, m.w, m.embed, s2, m.d2t, m.t2d, kSteps, kWeights, nullptr);
  for (int k = 0; k < kSteps; ++k) EXPECT_EQ(st_other.loss_sum[k], st.loss_sum[k]) << "step " << k;
  float* q = s2.target_probs.data<float>() + (p - 1) * 10;
  std::fill(q, q + 10, 0.0f);
  q[3] = 1.0f;
  auto st_changed = ttt_forward_backward(m.cfg, m.w, m.embed, s2, m.d2t, m.t2d, kSteps, kWeights, nullptr);
  for (int k = 0; k < kSteps; ++k) EXPECT_NE(st_changed.loss_sum[k], st.loss_sum[k]) << "step " << k;
}

// Trap (EAGLE #317): the last position is never supervised against padding. With every mask 1 and
// every argmax selected, step k has T-1-k computed rows but only T-2-k valid ones (t+k+2 <= T-1).
TEST(DraftTTT, LastPositionNeverSupervisedAgainstPadding) {
  auto m = make_tiny_draft(23);
  const int64_t T = 9;
  auto s = make_tiny_sample(m, T, 24);
  for (int64_t t = 0; t < T; ++t) {
    s.loss_mask[t] = 1;
    s.target_argmax[t] = m.selected[(t * 3) % 10];
  }
  std::vector<Tensor> logits;
  auto st = ttt_forward_backward(m.cfg, m.w, m.embed, s, m.d2t, m.t2d, kSteps, kWeights, nullptr, &logits);
  for (int k = 0; k < kSteps; ++k) {
    EXPECT_EQ(logits[k].dim(0), T - 1 - k);
    EXPECT_EQ(st.valid[k], T - 2 - k) << "step " << k;
    EXPECT_EQ(st.acc_rows[k], T - 2 - k) << "step " << k;
  }
  EXPECT_EQ(ttt_valid_counts(s, m.t2d, kSteps), st.valid);
  // An unselected target argmax drops the row from the loss but not from acc_k.
  s.target_argmax[4] = 3;  // id 3 is not in the draft vocabulary
  auto st2 = ttt_forward_backward(m.cfg, m.w, m.embed, s, m.d2t, m.t2d, kSteps, kWeights, nullptr);
  for (int k = 0; k < kSteps; ++k) {
    EXPECT_EQ(st2.valid[k], T - 3 - k) << "step " << k;
    EXPECT_EQ(st2.acc_rows[k], T - 2 - k) << "step " << k;
  }
}

// Short samples: steps without any row contribute nothing; T <= 1 is an empty pass.
TEST(DraftTTT, ShortSamples) {
  auto m = make_tiny_draft(29);
  for (int64_t T : {1, 2, 3, 4}) {
    auto s = make_tiny_sample(m, T, 30 + T);
    DraftWeights g = DraftWeights::zeros(m.cfg);
    std::vector<Tensor> logits;
    auto st = ttt_forward_backward(m.cfg, m.w, m.embed, s, m.d2t, m.t2d, 7, std::vector<double>(7, 1.0), &g, &logits);
    for (int k = 0; k < 7; ++k) {
      EXPECT_EQ(logits[k].dim(0), std::max<int64_t>(0, T - 1 - k));
      EXPECT_EQ(st.acc_rows[k] <= std::max<int64_t>(0, T - 2 - k), true);
    }
  }
}

TEST(DraftTTT, RejectsInconsistentInputs) {
  auto m = make_tiny_draft(31);
  auto s = make_tiny_sample(m, 6, 32);
  EXPECT_THROW(ttt_forward_backward(m.cfg, m.w, m.embed, s, m.d2t, m.t2d, 3, {1.0, 1.0}, nullptr), Error);
  auto bad = m.d2t;
  bad.pop_back();
  EXPECT_THROW(ttt_forward_backward(m.cfg, m.w, m.embed, s, bad, m.t2d, 3, kWeights, nullptr), Error);
  s.ids[2] = 99;  // outside V
  EXPECT_THROW(ttt_forward_backward(m.cfg, m.w, m.embed, s, m.d2t, m.t2d, 3, kWeights, nullptr), Error);
}

}  // namespace
}  // namespace aerie
