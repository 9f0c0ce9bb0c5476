// DraftConfig (from the target, export config.json round trip), init_draft_weights, make_ttt_sample.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "draft_testing.h"
#include "model/draft.h"
#include "test_util.h"

namespace aerie {
namespace {

TargetConfig fake_target() {
  TargetConfig t;
  t.hidden_size = 64;
  t.intermediate_size = 172;
  t.num_hidden_layers = 8;
  t.num_attention_heads = 8;
  t.num_key_value_heads = 4;
  t.head_dim = 8;
  t.vocab_size = 512;
  t.max_position_embeddings = 131072;
  t.rms_norm_eps = 1e-5;
  t.rope.theta = 500000.0;
  t.rope.type = "llama3";
  t.rope.factor = 8.0;
  t.rope.low_freq_factor = 1.0;
  t.rope.high_freq_factor = 4.0;
  t.rope.original_max_position_embeddings = 8192;
  t.raw = {{"rope_theta", 500000.0},
           {"rope_scaling",
            {{"rope_type", "llama3"}, {"factor", 8.0}, {"low_freq_factor", 1.0}, {"high_freq_factor", 4.0},
             {"original_max_position_embeddings", 8192}}}};
  return t;
}

TEST(DraftConfig, FromTargetCopiesRopeAndMaxPositions) {
  // Trap (SGLang #6783, SpecForge #249): max positions and RoPE scaling must come from the target.
  auto c = DraftConfig::from_target(fake_target(), 100, default_aux_layers(8));
  EXPECT_EQ(c.max_position_embeddings, 131072);
  EXPECT_EQ(c.rope.type, "llama3");
  EXPECT_EQ(c.rope.theta, 500000.0);
  EXPECT_EQ(c.rope_scaling["factor"], 8.0);
  EXPECT_EQ(c.target_num_hidden_layers, 8);
  EXPECT_THROW(DraftConfig::from_target(fake_target(), 513, default_aux_layers(8)), Error);
  EXPECT_THROW(DraftConfig::from_target(fake_target(), 100, {2, 4}), Error);
  EXPECT_THROW(DraftConfig::from_target(fake_target(), 100, {2, 4, 9}), Error);
}

// A linear-scaled target (Llama-2 long-context style): its draft config round-trips (it was rejected).
TEST(DraftConfig, LinearRopeScalingRoundTrips) {
  TargetConfig t = fake_target();
  t.rope.type = "linear";
  t.rope.factor = 4.0;
  t.raw["rope_scaling"] = {{"rope_type", "linear"}, {"factor", 4.0}};
  auto c = DraftConfig::from_target(t, 100, default_aux_layers(8));
  auto back = DraftConfig::from_json(nlohmann::json::parse(c.to_json().dump()));
  EXPECT_EQ(back.rope.type, "linear");
  EXPECT_EQ(back.rope.factor, 4.0);
  EXPECT_EQ(back.rope.theta, 500000.0);
}

// A transformers 5.x target writes its rope as one rope_parameters object: the draft config keeps it in the
// 4.x spelling, so that a checkpoint's config reads back as the rope the draft trained with (it read back
// as the default rope: a resumed run and the export's rope check would see another rope).
TEST(DraftConfig, RopeParametersOfTransformers5RoundTrip) {
  TargetConfig t = fake_target();
  t.raw = {{"rope_parameters",
            {{"rope_type", "llama3"}, {"rope_theta", 500000.0}, {"factor", 8.0}, {"low_freq_factor", 1.0},
             {"high_freq_factor", 4.0}, {"original_max_position_embeddings", 8192}}}};
  const auto c = DraftConfig::from_target(t, 100, default_aux_layers(8));
  EXPECT_EQ(c.rope_scaling["rope_type"], "llama3");
  EXPECT_FALSE(c.rope_scaling.contains("rope_theta"));
  const auto back = DraftConfig::from_json(nlohmann::json::parse(c.to_json().dump()));
  EXPECT_EQ(back.rope.type, "llama3");
  EXPECT_EQ(back.rope.factor, 8.0);
  EXPECT_EQ(back.rope.theta, 500000.0);
  EXPECT_EQ(back.rope.original_max_position_embeddings, 8192);
  // The default rope in rope_parameters: no rope_scaling (null), theta kept.
  t.raw = {{"rope_parameters", {{"rope_type", "default"}, {"rope_theta", 10000.0}}}};
  t.rope = RopeParams{};
  const auto d = DraftConfig::from_target(t, 100, default_aux_layers(8));
  EXPECT_TRUE(d.rope_scaling.is_null());
  EXPECT_EQ(DraftConfig::from_json(d.to_json()).rope.type, "default");
}

TEST(DraftConfig, JsonIsTheExportConfigAndRoundTrips) {
  auto c = DraftConfig::from_target(fake_target(), 100, default_aux_layers(8));
  auto j = c.to_json();
  EXPECT_EQ(j["architectures"][0], "LlamaForCausalLMEagle3");
  EXPECT_EQ(j["num_hidden_layers"], 1);
  EXPECT_EQ(j["draft_vocab_size"], 100);
  EXPECT_EQ(j["vocab_size"], 512);
  EXPECT_EQ(j["tie_word_embeddings"], false);
  EXPECT_EQ(j["torch_dtype"], "bfloat16");
  EXPECT_EQ(j["rope_theta"], 500000.0);
  EXPECT_EQ(j["rope_scaling"]["rope_type"], "llama3");
  EXPECT_FALSE(j.contains("target_hidden_size")) << "only when it differs";
  EXPECT_FALSE(j.contains("eagle_config")) << "default aux layers need no ids";
  // A config of two layers (an edited export, a multi-layer draft) is not read as its first layer alone.
  nlohmann::json two = j;
  two["num_hidden_layers"] = 2;
  EXPECT_NE(testing::error_of([&] { DraftConfig::from_json(two); })
                .find("num_hidden_layers 2: aerie's drafts have one decoder layer"),
            std::string::npos);
  auto back = DraftConfig::from_json(nlohmann::json::parse(j.dump()));
  EXPECT_EQ(back.to_json(), j);
  EXPECT_EQ(back.aux_layers, c.aux_layers);
  EXPECT_EQ(back.rope.factor, 8.0);
  EXPECT_EQ(back.rope.original_max_position_embeddings, 8192);
  EXPECT_EQ(back.head_dim, 8);

  c.aux_layers = {1, 3, 6};
  c.target_hidden_size = 96;
  auto j2 = c.to_json();
  EXPECT_EQ(j2["eagle_config"]["eagle_aux_hidden_state_layer_ids"], nlohmann::json({1, 3, 6}));
  EXPECT_EQ(j2["target_hidden_size"], 96);
  auto back2 = DraftConfig::from_json(j2);
  EXPECT_EQ(back2.aux_layers, (std::vector<int>{1, 3, 6}));
  EXPECT_EQ(back2.target_hidden_size, 96);
  // EAGLE-3.1's norm_before_residual: written only when on (vLLM's default is off; SGLang has none), read back,
  // a value that is not a bool refused by name.
  EXPECT_FALSE(j2.contains("norm_before_residual"));
  EXPECT_FALSE(back2.norm_before_residual);
  c.norm_before_residual = true;
  auto jn = c.to_json();
  EXPECT_EQ(jn["norm_before_residual"], true);
  EXPECT_TRUE(DraftConfig::from_json(jn).norm_before_residual);
  jn["norm_before_residual"] = "yes";
  EXPECT_NE(testing::error_of([&] { DraftConfig::from_json(jn); }).find("norm_before_residual"), std::string::npos);
  c.norm_before_residual = false;
  // EAGLE-3.1's norm_output: the same (written only when on, read back, a non-bool refused by name).
  EXPECT_FALSE(j2.contains("norm_output"));
  c.norm_output = true;
  nlohmann::json jo = c.to_json();
  EXPECT_EQ(jo["norm_output"], true);
  EXPECT_TRUE(DraftConfig::from_json(jo).norm_output);
  jo["norm_output"] = 1;
  EXPECT_NE(testing::error_of([&] { DraftConfig::from_json(jo); }).find("norm_output"), std::string::npos);
  c.norm_output = false;
  // EAGLE-3.1's norm_before_fc: written at the top level only when on, read back; read from eagle_config
  // first, then the top level, as vLLM's and SGLang's llama_eagle3.py do (eagle_config.get("norm_before_fc",
  // getattr(config, "norm_before_fc", False)): NVIDIA's checkpoints keep it in eagle_config); a non-bool
  // refused by name in either place.
  EXPECT_FALSE(j2.contains("norm_before_fc"));
  EXPECT_FALSE(back2.norm_before_fc);
  c.norm_before_fc = true;
  nlohmann::json jf = c.to_json();
  EXPECT_EQ(jf["norm_before_fc"], true);
  EXPECT_TRUE(DraftConfig::from_json(jf).norm_before_fc);
  jf["eagle_config"]["norm_before_fc"] = false;  // eagle_config's key wins over the top level's
  EXPECT_FALSE(DraftConfig::from_json(jf).norm_before_fc);
  jf.erase("norm_before_fc");
  jf["eagle_config"]["norm_before_fc"] = true;
  EXPECT_TRUE(DraftConfig::from_json(jf).norm_before_fc);
  jf["eagle_config"]["norm_before_fc"] = "true";
  EXPECT_NE(testing::error_of([&] { DraftConfig::from_json(jf); }).find("eagle_config.norm_before_fc"),
            std::string::npos);
  jf["eagle_config"].erase("norm_before_fc");
  jf["norm_before_fc"] = 0;
  EXPECT_NE(testing::error_of([&] { DraftConfig::from_json(jf); }).find("norm_before_fc"), std::string::npos);
  c.norm_before_fc = false;
  // EAGLE-3.1's fc_norm (SpecForge's getattr(config, "fc_norm", False)): written only when on, read back; a
  // non-bool, the pair with norm_before_fc and an MLA draft with it refused by name.
  EXPECT_FALSE(j2.contains("fc_norm"));
  c.fc_norm = true;
  nlohmann::json jcn = c.to_json();
  EXPECT_EQ(jcn["fc_norm"], true);
  EXPECT_TRUE(DraftConfig::from_json(jcn).fc_norm);
  EXPECT_EQ(DraftWeights::names(DraftConfig::from_json(jcn)).back(), "fc_norm.2.weight");
  jcn["norm_before_fc"] = true;
  EXPECT_NE(testing::error_of([&] { DraftConfig::from_json(jcn); }).find("fc_norm"), std::string::npos);
  jcn["norm_before_fc"] = false;
  jcn["fc_norm"] = "yes";
  EXPECT_NE(testing::error_of([&] { DraftConfig::from_json(jcn); }).find("fc_norm must be true or false"),
            std::string::npos);
  c.fc_norm = false;
  // The sliding window as vLLM reads it (LlamaAttention: layer_types[0] == "sliding_attention" takes
  // config.sliding_window): written only when set, read back; a sliding_window without layer_types is not
  // applied (as in vLLM); a sliding layer without a positive window, an unknown layer kind, an MLA draft
  // with a window refused by name.
  EXPECT_FALSE(j2.contains("layer_types"));
  EXPECT_FALSE(j2.contains("sliding_window"));
  c.sliding_window = 2048;
  nlohmann::json jw = c.to_json();
  EXPECT_EQ(jw["layer_types"], nlohmann::json({"sliding_attention"}));
  EXPECT_EQ(jw["sliding_window"], 2048);
  EXPECT_EQ(DraftConfig::from_json(jw).sliding_window, 2048);
  EXPECT_EQ(DraftConfig::from_json(jw).to_json(), jw);
  jw["layer_types"] = {"full_attention"};
  EXPECT_EQ(DraftConfig::from_json(jw).sliding_window, 0);
  jw.erase("layer_types");
  EXPECT_EQ(DraftConfig::from_json(jw).sliding_window, 0) << "vLLM applies sliding_window through layer_types only";
  jw["layer_types"] = {"sliding_attention"};
  jw["sliding_window"] = 0;
  EXPECT_NE(testing::error_of([&] { DraftConfig::from_json(jw); }).find("sliding_window"), std::string::npos);
  jw.erase("sliding_window");
  EXPECT_NE(testing::error_of([&] { DraftConfig::from_json(jw); }).find("sliding_window"), std::string::npos);
  jw["sliding_window"] = 16;
  jw["layer_types"] = {"chunked_attention"};
  EXPECT_NE(testing::error_of([&] { DraftConfig::from_json(jw); }).find("chunked_attention"), std::string::npos);
  c.sliding_window = 0;
  j2.erase("hidden_size");
  EXPECT_THROW(DraftConfig::from_json(j2), Error);

  // A target of fewer than 3 layers has no default ids (default_aux_layers throws): the config names them.
  c.target_num_hidden_layers = 2;
  c.aux_layers = {0, 1, 2};
  auto j3 = c.to_json();
  EXPECT_EQ(j3["eagle_config"]["eagle_aux_hidden_state_layer_ids"], nlohmann::json({0, 1, 2}));
}

TEST(DraftInit, DeterministicBoundedAndLmHeadFromSelectedRows) {
  auto m = testing::make_tiny_draft(1);
  auto a = init_draft_weights(m.cfg, m.target_lm, m.selected, 42);
  auto b = init_draft_weights(m.cfg, m.target_lm, m.selected, 42);
  auto c = init_draft_weights(m.cfg, m.target_lm, m.selected, 43);
  auto na = a.named(), nb = b.named(), nc = c.named();
  ASSERT_EQ(na.size(), 13u);
  EXPECT_EQ(na[0].first, "fc.weight");
  EXPECT_EQ(na[12].first, "lm_head.weight");
  for (size_t i = 0; i < na.size(); ++i) {
    EXPECT_EQ(na[i].second->to_float_vector(), nb[i].second->to_float_vector()) << na[i].first;
    if (i < 8) {
      EXPECT_NE(na[i].second->to_float_vector(), nc[i].second->to_float_vector()) << na[i].first;
      const double bound = 1.0 / std::sqrt(static_cast<double>(na[i].second->dim(1)));
      double mx = 0;
      for (float v : na[i].second->to_float_vector()) mx = std::max(mx, std::fabs(static_cast<double>(v)));
      EXPECT_LE(mx, bound) << na[i].first;
      EXPECT_GT(mx, 0.5 * bound) << na[i].first;
    }
  }
  for (float v : a.norm.to_float_vector()) EXPECT_EQ(v, 1.0f);
  for (size_t i = 0; i < m.selected.size(); ++i)
    for (int64_t h = 0; h < 8; ++h)
      EXPECT_EQ(a.lm_head.data<float>()[i * 8 + h], m.target_lm.data<float>()[m.selected[i] * 8 + h]);
}

TEST(DraftSample, TargetIsSoftmaxOverSelectedColumnsAndArgmaxOverAll) {
  auto m = testing::make_tiny_draft(2);
  std::mt19937_64 rng(3);
  const int64_t T = 70;  // crosses the 64-row chunk of make_ttt_sample
  Tensor z = testing::random_tensor({T, 8}, rng, 1.0), aux = testing::random_tensor({T, 18}, rng, 1.0);
  std::vector<int32_t> ids(T, 1);
  std::vector<uint8_t> mask(T, 1);
  auto s = make_ttt_sample(ids, mask, aux, z, m.target_lm, m.selected);
  ASSERT_EQ(s.target_probs.dim(0), T);
  ASSERT_EQ(s.target_probs.dim(1), 10);
  int unselected = 0;
  for (int64_t t = 0; t < T; ++t) {
    std::vector<double> l(16);
    for (int v = 0; v < 16; ++v)
      for (int h = 0; h < 8; ++h) l[v] += static_cast<double>(z.data<float>()[t * 8 + h]) * m.target_lm.data<float>()[v * 8 + h];
    EXPECT_EQ(s.target_argmax[t], std::max_element(l.begin(), l.end()) - l.begin()) << "row " << t;
    unselected += !m.t2d[s.target_argmax[t]];
    double mx = -1e300, zs = 0;
    for (int64_t i : m.selected) mx = std::max(mx, l[i]);
    for (int64_t i : m.selected) zs += std::exp(l[i] - mx);
    std::vector<float> want;
    for (int64_t i : m.selected) want.push_back(static_cast<float>(std::exp(l[i] - mx) / zs));
    testing::expect_close(s.target_probs.slice(t, t + 1).to_float_vector(), want, 1e-6f, 1e-5f, "probs");
  }
  EXPECT_GT(unselected, 0) << "some argmaxes should fall outside the draft vocabulary";
  EXPECT_THROW(make_ttt_sample(std::vector<int32_t>(T - 1, 1), mask, aux, z, m.target_lm, m.selected), Error);
}

}  // namespace
}  // namespace aerie
