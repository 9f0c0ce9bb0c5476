// The MLA draft (DraftConfig::is_mla; vLLM's Eagle3DeepseekV2ForCausalLM): its step-0 logits against a
// naive double-precision reference written from the formulas (DeepSeek-V2 section 2.1 in the expanded
// form, vLLM's DeepseekV2Eagle3DecoderLayer around it), its TTT gradient against finite differences, its
// config round trip and the gradient-ready order. The decoder's equality with the TTT chain is in
// draft_decoder_test.cc, the export's names against vLLM's loader in tests/train/export_test.cc.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <random>
#include <set>

#include "draft_testing.h"
#include "kernels/rope.h"
#include "model/draft.h"
#include "test_util.h"

namespace aerie {
namespace {

using Vec = std::vector<double>;
using Mat = std::vector<Vec>;  // rows

Mat to_mat(const Tensor& t) {
  const int64_t r = t.dim(0), c = t.numel() / r;
  Mat m(r, Vec(c));
  for (int64_t i = 0; i < r; ++i)
    for (int64_t j = 0; j < c; ++j) m[i][j] = t.data<float>()[i * c + j];
  return m;
}
Vec mul(const Mat& w, const Vec& x) {  // w x
  Vec y(w.size(), 0.0);
  for (size_t i = 0; i < w.size(); ++i)
    for (size_t j = 0; j < x.size(); ++j) y[i] += w[i][j] * x[j];
  return y;
}
Vec rms(const Vec& x, const Vec& w, double eps) {
  double ss = 0;
  for (double v : x) ss += v * v;
  const double r = 1.0 / std::sqrt(ss / static_cast<double>(x.size()) + eps);
  Vec y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = x[i] * r * w[i];
  return y;
}
// DeepSeek's interleaved rope on x[off .. off+2*inv.size()): pair (2i, 2i+1) rotated by pos * inv[i],
// times the rope's attention factor.
void rope(Vec& x, size_t off, double pos, const std::vector<float>& inv, double factor) {
  for (size_t i = 0; i < inv.size(); ++i) {
    const double a = pos * static_cast<double>(inv[i]), c = std::cos(a), s = std::sin(a);
    const double x0 = x[off + 2 * i], x1 = x[off + 2 * i + 1];
    x[off + 2 * i] = (x0 * c - x1 * s) * factor;
    x[off + 2 * i + 1] = (x1 * c + x0 * s) * factor;
  }
}

// Step-0 logits [T-1][K] of the MLA draft on sample s (row t: token x_{t+1} at position t, hidden fc(f_t)).
Mat reference_step0(const testing::TinyDraft& m, const TTTSample& s) {
  const DraftConfig& c = m.cfg;
  std::map<std::string, Mat> W;  // the matrices
  std::map<std::string, Vec> N;  // the norm weights
  for (const auto& [name, t] : m.w.named()) {
    if (t->ndim() == 2) {
      W[name] = to_mat(*t);
    } else {
      const std::vector<float> v = t->to_float_vector();
      N[name] = Vec(v.begin(), v.end());
    }
  }
  auto vec = [&](const std::string& n) { return N.at(n); };
  const std::string A = "midlayer.self_attn.";
  const int64_t T = static_cast<int64_t>(s.ids.size()), n = T - 1, H = c.hidden_size, nh = c.num_attention_heads;
  const int64_t nope = c.qk_nope_head_dim, rp = c.qk_rope_head_dim, lora = c.kv_lora_rank, vd = c.v_head_dim,
                dq = nope + rp;
  const double eps = c.rms_norm_eps;
  const std::vector<float> inv = rope_inv_freq(c.rope, rp);
  const double factor = rope_attention_factor(c.rope);
  // DeepseekV3Attention.scaling: (nope + rope)^-0.5 * (0.1 mscale_all_dim ln(factor) + 1)^2.
  const double ms = 0.1 * c.rope.mscale_all_dim * std::log(c.rope.factor) + 1.0;
  const double scale = ms * ms / std::sqrt(static_cast<double>(dq));
  const Mat aux = to_mat(s.aux_hidden), emb = to_mat(m.embed);
  std::vector<Vec> g(n), q(n), kk(n), vv(n);
  for (int64_t t = 0; t < n; ++t) {
    g[t] = mul(W["fc.weight"], aux[t]);
    Vec a = rms(emb[s.ids[t + 1]], vec("midlayer.input_layernorm.weight"), eps);
    const Vec hn = rms(g[t], vec("midlayer.hidden_norm.weight"), eps);
    a.insert(a.end(), hn.begin(), hn.end());
    q[t] = c.q_lora_rank > 0 ? mul(W[A + "q_b_proj.weight"],
                                   rms(mul(W[A + "q_a_proj.weight"], a), vec(A + "q_a_layernorm.weight"), eps))
                             : mul(W[A + "q_proj.weight"], a);
    for (int64_t h = 0; h < nh; ++h) rope(q[t], h * dq + nope, t, inv, factor);
    Vec ckv = mul(W[A + "kv_a_proj_with_mqa.weight"], a);
    const Vec cn = rms(Vec(ckv.begin(), ckv.begin() + lora), vec(A + "kv_a_layernorm.weight"), eps);
    rope(ckv, lora, t, inv, factor);  // k_pe, shared by the heads
    const Vec kv = mul(W[A + "kv_b_proj.weight"], cn);  // per head [k_nope | v]
    for (int64_t h = 0; h < nh; ++h) {
      for (int64_t i = 0; i < nope; ++i) kk[t].push_back(kv[h * (nope + vd) + i]);
      for (int64_t i = 0; i < rp; ++i) kk[t].push_back(ckv[lora + i]);
      for (int64_t i = 0; i < vd; ++i) vv[t].push_back(kv[h * (nope + vd) + nope + i]);
    }
  }
  Mat logits(n);
  for (int64_t t = 0; t < n; ++t) {
    Vec o_in(nh * vd, 0.0);
    for (int64_t h = 0; h < nh; ++h) {
      Vec sc(t + 1);
      double mx = -1e300;
      for (int64_t j = 0; j <= t; ++j) {
        double d = 0;
        for (int64_t i = 0; i < dq; ++i) d += q[t][h * dq + i] * kk[j][h * dq + i];
        sc[j] = scale * d;
        mx = std::max(mx, sc[j]);
      }
      double z = 0;
      for (double& x : sc) z += (x = std::exp(x - mx));
      for (int64_t j = 0; j <= t; ++j)
        for (int64_t i = 0; i < vd; ++i) o_in[h * vd + i] += sc[j] / z * vv[j][h * vd + i];
    }
    Vec y = mul(W[A + "o_proj.weight"], o_in);
    for (int64_t i = 0; i < H; ++i) y[i] += g[t][i];
    const Vec n2 = rms(y, vec("midlayer.post_attention_layernorm.weight"), eps);
    const Vec gate = mul(W["midlayer.mlp.gate_proj.weight"], n2), up = mul(W["midlayer.mlp.up_proj.weight"], n2);
    Vec act(gate.size());
    for (size_t i = 0; i < act.size(); ++i) act[i] = gate[i] / (1.0 + std::exp(-gate[i])) * up[i];
    Vec o = mul(W["midlayer.mlp.down_proj.weight"], act);
    for (int64_t i = 0; i < H; ++i) o[i] += y[i];
    logits[t] = mul(W["lm_head.weight"], rms(o, vec("norm.weight"), eps));
  }
  return logits;
}

TEST(DraftMla, Step0LogitsMatchTheNaiveReference) {
  for (int64_t q_lora : {int64_t{6}, int64_t{0}}) {
    auto m = testing::make_tiny_mla_draft(31, q_lora);
    auto s = testing::make_tiny_sample(m, 9, 32);
    std::vector<Tensor> logits;
    ttt_forward_backward(m.cfg, m.w, m.embed, s, m.d2t, m.t2d, 1, {1.0}, nullptr, &logits);
    const Mat ref = reference_step0(m, s);
    ASSERT_EQ(logits[0].dim(0), static_cast<int64_t>(ref.size()));
    double worst = 0, mag = 0;
    for (size_t t = 0; t < ref.size(); ++t)
      for (size_t k = 0; k < ref[t].size(); ++k) {
        worst = std::max(worst, std::fabs(logits[0].data<float>()[t * ref[t].size() + k] - ref[t][k]));
        mag = std::max(mag, std::fabs(ref[t][k]));
      }
    EXPECT_LT(worst, 1e-5 * (1 + mag)) << "q_lora " << q_lora << ": largest logit " << mag;
  }
}

// The reference is sensitive to what it checks: the same draft read as if its rope were the Hugging Face
// rotate_half layout (the Llama draft's) or without the YaRN softmax factor gives other logits.
TEST(DraftMla, ReferenceSeesTheRopeAndScale) {
  auto m = testing::make_tiny_mla_draft(33, 6);
  auto s = testing::make_tiny_sample(m, 9, 34);
  const Mat ref = reference_step0(m, s);
  auto m2 = m;
  m2.cfg.rope.mscale_all_dim = 0.0;  // softmax scale and rope factor both change
  const Mat other = reference_step0(m2, s);
  double diff = 0;
  for (size_t t = 0; t < ref.size(); ++t)
    for (size_t k = 0; k < ref[t].size(); ++k) diff = std::max(diff, std::fabs(ref[t][k] - other[t][k]));
  EXPECT_GT(diff, 1e-3);
}

// fp32 central differences of the whole TTT loss (3 steps: the diagonal keys of the MLA layer too).
TEST(DraftMla, GradientMatchesFiniteDifferences) {
  const int steps = 3;
  const std::vector<double> wts = {1.0, 0.8, 0.64};
  for (int64_t q_lora : {int64_t{6}, int64_t{0}}) {
    auto m = testing::make_tiny_mla_draft(41, q_lora);
    auto s = testing::make_tiny_sample(m, 9, 42);
    DraftWeights g = DraftWeights::zeros(m.cfg);
    auto total = [&](const TTTStats& st) {
      double l = 0;
      for (int k = 0; k < steps; ++k) l += wts[k] * st.loss_sum[k];
      return l;
    };
    const double L = total(ttt_forward_backward(m.cfg, m.w, m.embed, s, m.d2t, m.t2d, steps, wts, &g));
    auto named_w = m.w.named();
    auto named_g = g.named();
    ASSERT_EQ(named_w.size(), q_lora > 0 ? 16u : 14u);
    std::mt19937_64 rng(43);
    for (size_t ti = 0; ti < named_w.size(); ++ti) {
      Tensor& w = *named_w[ti].second;
      const std::vector<float> ga = named_g[ti].second->to_float_vector();
      double gnorm = 0;
      for (float v : ga) gnorm += std::fabs(v);
      EXPECT_GT(gnorm, 0.0) << named_w[ti].first << " gets no gradient";
      for (int p = 0; p < 4; ++p) {
        const int64_t i = static_cast<int64_t>(rng() % w.numel());
        float* x = w.data<float>() + i;
        const float orig = *x, e = std::max(1e-3f, 1e-2f * std::fabs(orig));
        *x = orig + e;
        const double lp = total(ttt_forward_backward(m.cfg, m.w, m.embed, s, m.d2t, m.t2d, steps, wts, nullptr));
        *x = orig - e;
        const double lm = total(ttt_forward_backward(m.cfg, m.w, m.embed, s, m.d2t, m.t2d, steps, wts, nullptr));
        *x = orig;
        const double fd = (lp - lm) / (2.0 * (static_cast<double>(orig + e) - orig));
        const double noise = 1e-6 * (1 + std::fabs(L)) / e;
        EXPECT_NEAR(ga[i], fd, 3 * noise + 2e-3 + 2e-2 * std::fabs(fd))
            << "q_lora " << q_lora << " " << named_w[ti].first << "[" << i << "]";
      }
    }
  }
}

// DraftConfig::num_parameters (train's memory check before allocating) counts what
// DraftWeights::zeros allocates, for the MLA draft with and without a query LoRA and for the Llama draft
// with either EAGLE-3.1 input norm.
TEST(DraftMla, NumParametersCountsTheWeights) {
  auto count = [](const DraftConfig& c) {
    DraftWeights w = DraftWeights::zeros(c);
    double n = 0;
    for (auto& [name, t] : w.named()) n += static_cast<double>(t->numel());
    return n;
  };
  for (int q_lora : {0, 6}) {
    const DraftConfig c = testing::make_tiny_mla_draft(53, q_lora).cfg;
    EXPECT_EQ(c.num_parameters(), count(c)) << "q_lora " << q_lora;
  }
  DraftConfig l = testing::make_tiny_mla_draft(54, 0).cfg;
  l.kv_lora_rank = l.q_lora_rank = 0;  // the Llama draft of the same widths
  l.num_key_value_heads = 1;
  l.head_dim = 4;
  EXPECT_EQ(l.num_parameters(), count(l));
  l.norm_before_fc = true;
  EXPECT_EQ(l.num_parameters(), count(l));
  l.norm_before_fc = false;
  l.fc_norm = true;
  EXPECT_EQ(l.num_parameters(), count(l));
}

TEST(DraftMla, ConfigRoundTripsAndReadsAsVllmDoes) {
  auto m = testing::make_tiny_mla_draft(51, 6);
  m.cfg.aux_layers = {1, 2, 3};
  m.cfg.target_num_hidden_layers = 4;
  const nlohmann::json j = m.cfg.to_json();
  EXPECT_EQ(j["architectures"][0], "Eagle3DeepseekV2ForCausalLM");
  EXPECT_EQ(j["model_type"], "deepseek_v2");  // vLLM turns a deepseek_v3 draft into its MTP module
  EXPECT_EQ(j["kv_lora_rank"], 4);
  EXPECT_EQ(j["q_lora_rank"], 6);
  EXPECT_EQ(j["v_head_dim"], 3);
  // An int (transformers 5's DeepseekV3Config refuses null, and vLLM 0.26 parses the draft's config with it).
  EXPECT_TRUE(j["n_routed_experts"].is_number_integer()) << j["n_routed_experts"];
  EXPECT_EQ(j["n_routed_experts"], 0);
  const DraftConfig back = DraftConfig::from_json(j);
  EXPECT_TRUE(back.is_mla());
  EXPECT_EQ(back.to_json(), j);
  EXPECT_FLOAT_EQ(back.softmax_scale(), m.cfg.softmax_scale());
  // No query LoRA: q_lora_rank null (DeepSeek-V2-Lite's config), read back as 0.
  auto m0 = testing::make_tiny_mla_draft(52, 0);
  const nlohmann::json j0 = m0.cfg.to_json();
  EXPECT_TRUE(j0["q_lora_rank"].is_null());
  EXPECT_EQ(DraftConfig::from_json(j0).q_lora_rank, 0);
  // A config whose value head is wider than the query/key head is refused by name.
  nlohmann::json bad = j;
  bad["v_head_dim"] = 9;
  EXPECT_NE(testing::error_of([&] { DraftConfig::from_json(bad); }).find("v_head_dim 9"), std::string::npos);
  // architectures and the MLA fields must agree (a config edited by hand, or a Llama draft's with MLA fields).
  nlohmann::json no_lora = j;
  no_lora.erase("kv_lora_rank");
  EXPECT_NE(testing::error_of([&] { DraftConfig::from_json(no_lora); }).find("kv_lora_rank is missing"),
            std::string::npos);
  nlohmann::json llama_arch = j;
  llama_arch["architectures"] = {"LlamaForCausalLMEagle3"};
  EXPECT_NE(testing::error_of([&] { DraftConfig::from_json(llama_arch); }).find("architectures is LlamaForCausalLMEagle3"),
            std::string::npos);
  // vLLM's Eagle3DeepseekV2ForCausalLM reads no sliding window: an MLA config with one is refused.
  nlohmann::json windowed = j;
  windowed["layer_types"] = {"sliding_attention"};
  windowed["sliding_window"] = 64;
  EXPECT_NE(testing::error_of([&] { DraftConfig::from_json(windowed); }).find("MLA draft with a sliding window"),
            std::string::npos);
  // Weights of the other layout are refused when the layer is built.
  auto llama = testing::make_tiny_draft(53);
  auto s = testing::make_tiny_sample(llama, 6, 54);
  EXPECT_NE(testing::error_of([&] {
              ttt_forward_backward(m.cfg, llama.w, m.embed, s, m.d2t, m.t2d, 1, {1.0}, nullptr);
            }).find("a Llama draft's, the config an MLA draft's"),
            std::string::npos);
}

// An MLA draft of a target without YaRN: vLLM 0.18.0-0.27.1 read any rope_scaling of the draft as DeepSeek's YaRN
// (and transformers 5 fills an absent one), so the export writes a YaRN of factor 1, which is the plain rope: the
// config read back gives the same frequencies and softmax scale, and round-trips.
TEST(DraftMla, ThePlainRopeIsWrittenAsYarnOfFactorOne) {
  auto m = testing::make_tiny_mla_draft(55, 6);
  m.cfg.rope = RopeParams{};
  m.cfg.rope.theta = 10000.0;
  m.cfg.rope_scaling = nlohmann::json();
  const nlohmann::json j = m.cfg.to_json();
  ASSERT_TRUE(j["rope_scaling"].is_object()) << j.dump();
  EXPECT_EQ(j["rope_scaling"]["type"], "yarn");
  EXPECT_EQ(j["rope_scaling"]["factor"], 1.0);
  const DraftConfig back = DraftConfig::from_json(j);
  EXPECT_EQ(back.rope.type, "yarn");
  EXPECT_EQ(rope_inv_freq(back.rope, back.qk_rope_head_dim), rope_inv_freq(m.cfg.rope, m.cfg.qk_rope_head_dim));
  EXPECT_EQ(back.softmax_scale(), m.cfg.softmax_scale());
  EXPECT_EQ(rope_attention_factor(back.rope), 1.0);
  EXPECT_EQ(back.to_json(), j);
}

// Every parameter is reported final once, lm_head first and fc last (the order the data-parallel
// all-reduces follow), with the MLA attention's weights where the Llama draft has q/k/v_proj.
TEST(DraftMla, GradientReadyOrderCoversEveryParameterOnce) {
  for (int64_t q_lora : {int64_t{6}, int64_t{0}}) {
    auto m = testing::make_tiny_mla_draft(61, q_lora);
    const std::vector<int> order = ttt_gradient_ready_order(m.cfg);
    const std::vector<std::string> names = DraftWeights::names(m.cfg);
    ASSERT_EQ(order.size(), names.size());
    EXPECT_EQ(std::set<int>(order.begin(), order.end()).size(), names.size());
    EXPECT_EQ(names[order.front()], "lm_head.weight");
    EXPECT_EQ(names[order.back()], "fc.weight");
    auto s = testing::make_tiny_sample(m, 8, 62);
    DraftWeights g = DraftWeights::zeros(m.cfg);
    std::vector<int> seen;
    ttt_forward_backward(m.cfg, m.w, m.embed, s, m.d2t, m.t2d, 2, {1.0, 0.8}, &g, nullptr,
                         [&](int i) { seen.push_back(i); });
    EXPECT_EQ(seen, order);
  }
}

}  // namespace
}  // namespace aerie
