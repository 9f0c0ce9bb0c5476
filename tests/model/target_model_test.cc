// TargetConfig and TargetModel on one rank: config parsing, the forward against a naive double-precision
// reference (target_testing.h), the captures of eagle3.md section 1, and the KV cache.
#include <filesystem>
#include <fstream>

#include "comm/communicator.h"
#include "core/error.h"
#include "io/safetensors.h"
#include "model/target.h"
#include "model/target_testing.h"
#include "test_util.h"

namespace aerie {
namespace {

using testing::expect_close;

std::vector<float> row_range(const Tensor& t, int64_t begin, int64_t end) {
  return t.slice(begin, end).to_float_vector();
}

/// Columns [c0, c1) of a 2-D F32 tensor, row-major.
std::vector<float> cols(const Tensor& t, int64_t c0, int64_t c1) {
  std::vector<float> all = t.to_float_vector(), out;
  for (int64_t i = 0; i < t.dim(0); ++i)
    out.insert(out.end(), all.begin() + i * t.dim(1) + c0, all.begin() + i * t.dim(1) + c1);
  return out;
}

std::vector<int32_t> some_ids(int64_t n, int64_t V, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> ids(n);
  for (auto& x : ids) x = static_cast<int32_t>(rng() % V);
  ids[0] = 1;
  return ids;
}

void write_json(const std::string& dir, const nlohmann::json& j) { std::ofstream(dir + "/config.json") << j.dump(); }

nlohmann::json base_config() {
  return {{"hidden_size", 64}, {"intermediate_size", 128}, {"num_hidden_layers", 32},
          {"num_attention_heads", 8}, {"vocab_size", 100}};
}

TEST(TargetConfig, DefaultsFollowTransformers) {
  std::string dir = testing::scratch_dir("llama_config_defaults");
  write_json(dir, base_config());
  TargetConfig c = load_target_config(dir);
  EXPECT_EQ(c.head_dim, 8);
  EXPECT_EQ(c.num_key_value_heads, 8);
  EXPECT_EQ(c.max_position_embeddings, 2048);
  EXPECT_DOUBLE_EQ(c.rms_norm_eps, 1e-6);
  EXPECT_DOUBLE_EQ(c.rope.theta, 10000.0);
  EXPECT_EQ(c.rope.type, "default");
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_EQ(c.bos_token_id, -1);
  EXPECT_EQ(c.eos_token_id, -1);
}

TEST(TargetConfig, Llama3RopeScalingAndEosList) {
  std::string dir = testing::scratch_dir("llama_config_llama31");
  nlohmann::json j = base_config();
  j["num_key_value_heads"] = 2;
  j["head_dim"] = 16;
  j["rope_theta"] = 500000.0;
  j["rope_scaling"] = {{"factor", 8.0}, {"low_freq_factor", 1.0}, {"high_freq_factor", 4.0},
                       {"original_max_position_embeddings", 8192}, {"rope_type", "llama3"}};
  j["eos_token_id"] = {128001, 128008, 128009};
  j["bos_token_id"] = 128000;
  j["tie_word_embeddings"] = true;
  write_json(dir, j);
  TargetConfig c = load_target_config(dir);
  EXPECT_EQ(c.head_dim, 16);
  EXPECT_EQ(c.num_key_value_heads, 2);
  EXPECT_EQ(c.rope.type, "llama3");
  EXPECT_DOUBLE_EQ(c.rope.theta, 500000.0);
  EXPECT_DOUBLE_EQ(c.rope.factor, 8.0);
  EXPECT_EQ(c.rope.original_max_position_embeddings, 8192);
  EXPECT_EQ(c.eos_token_id, 128001);
  EXPECT_EQ(c.raw["eos_token_id"].size(), 3u);  // the raw list is kept
  EXPECT_EQ(c.bos_token_id, 128000);
  EXPECT_TRUE(c.tie_word_embeddings);
}

TEST(TargetConfig, TransformersV5RopeParameters) {
  std::string dir = testing::scratch_dir("llama_config_v5");
  nlohmann::json j = base_config();
  j["rope_parameters"] = {{"rope_type", "llama3"}, {"rope_theta", 500000.0}, {"factor", 32.0},
                          {"low_freq_factor", 1.0}, {"high_freq_factor", 4.0},
                          {"original_max_position_embeddings", 8192}};
  write_json(dir, j);
  TargetConfig c = load_target_config(dir);
  EXPECT_EQ(c.rope.type, "llama3");
  EXPECT_DOUBLE_EQ(c.rope.theta, 500000.0);
  EXPECT_DOUBLE_EQ(c.rope.factor, 32.0);
}

TEST(TargetConfig, RejectsBadConfigs) {
  std::string dir = testing::scratch_dir("llama_config_bad");
  EXPECT_THROW(load_target_config(dir), Error);  // no config.json
  nlohmann::json j = base_config();
  j.erase("hidden_size");
  write_json(dir, j);
  EXPECT_THROW(load_target_config(dir), Error);
  j = base_config();
  j["rope_scaling"] = {{"type", "longrope"}, {"factor", 4.0}};
  write_json(dir, j);
  EXPECT_THROW(load_target_config(dir), Error);
  j = base_config();
  j["num_key_value_heads"] = 3;  // 8 heads are not a multiple of 3 kv heads
  write_json(dir, j);
  EXPECT_THROW(load_target_config(dir), Error);
  // A draft export where the target belongs (eval --model EXPORT): named as a draft.
  j = base_config();
  j["architectures"] = {"LlamaForCausalLMEagle3"};
  write_json(dir, j);
  EXPECT_NE(testing::error_of([&] { load_target_config(dir); }).find("an EAGLE draft's config (architecture "
                                                                     "LlamaForCausalLMEagle3)"),
            std::string::npos);
  j = base_config();
  j["draft_vocab_size"] = 32;
  write_json(dir, j);
  EXPECT_NE(testing::error_of([&] { load_target_config(dir); }).find("EAGLE draft"), std::string::npos);
  // A mistyped folder and a file: named as such.
  EXPECT_NE(testing::error_of([&] { load_target_config(dir + "/nope"); }).find("model folder " + dir +
                                                                                "/nope does not exist"),
            std::string::npos);
  EXPECT_NE(testing::error_of([&] { load_target_config(dir + "/config.json"); }).find("is not a folder"),
            std::string::npos);
  // aerie's own folders where the target belongs: a checkpoint (config.json of draft + train settings), a
  // run folder and an extract folder, each named.
  write_json(dir, nlohmann::json{{"aerie_version", "x"}, {"draft", nlohmann::json::object()},
                                 {"train", nlohmann::json::object()}});
  EXPECT_NE(testing::error_of([&] { load_target_config(dir); }).find("is a training checkpoint of aerie train"),
            std::string::npos);
  const std::string run = testing::scratch_dir("llama_config_run");
  std::filesystem::create_directories(run + "/checkpoints");
  EXPECT_NE(testing::error_of([&] { load_target_config(run); }).find("is a training run folder of aerie train"),
            std::string::npos);
  const std::string shards = testing::scratch_dir("llama_config_shards");
  std::ofstream(shards + "/shard-00000.h5") << "x";
  EXPECT_NE(testing::error_of([&] { load_target_config(shards); }).find("holds hidden-state shards"),
            std::string::npos);
}

TEST(TargetConfig, DefaultAuxLayers) {
  EXPECT_EQ(default_aux_layers(32), (std::vector<int>{2, 16, 29}));
  EXPECT_EQ(default_aux_layers(5), (std::vector<int>{2, 2, 2}));  // stories260K: the contract's default
  EXPECT_EQ(default_aux_layers(4), (std::vector<int>{2, 2, 1}));  // vLLM's formula, verbatim
  EXPECT_THROW(default_aux_layers(2), Error);                      // would name layer -1
}

// The forward of a random BF16 model with an untied lm_head against the naive reference: every
// residual stream r^k (k = 0..N), z and the logits. fp32 vs double on values of size ~1-10:
// atol 1e-4 + rtol 1e-4 covers fp32 accumulation over H = 32..48 terms and 3 layers.
TEST(TargetModel, MatchesNaiveReference) {
  for (bool tied : {false, true}) {
    std::string dir = testing::scratch_dir(tied ? "llama_ref_tied" : "llama_ref_untied");
    testing::TinyLlama m;
    m.tied = tied;
    m.dtype = tied ? DType::F32 : DType::BF16;
    testing::write_tiny_llama(dir, m);
    auto world = MpiCommunicator::world();
    auto self = world->split(world->rank(), 0);
    TargetModel model(dir, *self);
    EXPECT_EQ(model.config().eos_token_id, 2);
    std::vector<int32_t> ids = some_ids(11, m.V, 3);
    TargetOutput out = model.forward(ids, nullptr, {0, 1, 2, 3}, true);
    testing::RefForward ref = testing::reference_forward(dir, m, ids);
    ASSERT_EQ(out.aux_hidden.shape(), (Shape{11, 4 * m.H}));
    for (int k = 0; k <= 3; ++k)
      expect_close(cols(out.aux_hidden, k * m.H, (k + 1) * m.H), testing::to_float(ref.r[k]), 1e-4f, 1e-4f,
                   "r^" + std::to_string(k));
    expect_close(out.final_hidden.to_float_vector(), testing::to_float(ref.z), 1e-4f, 1e-4f, "z");
    expect_close(out.logits.to_float_vector(), testing::to_float(ref.logits), 1e-4f, 1e-4f, "logits");
    if (tied) {
      EXPECT_EQ(model.lm_head().raw(), model.embed_tokens().raw());
    }
  }
}

TEST(TargetModel, RejectsForeignTensorsAndBadShapes) {
  std::string dir = testing::scratch_dir("llama_bad_weights");
  testing::TinyLlama m;
  testing::write_tiny_llama(dir, m);
  auto world = MpiCommunicator::world();
  auto self = world->split(world->rank(), 0);
  SafetensorsFile f = load_safetensors(dir + "/model.safetensors");
  SafetensorsFile g = f;
  g.tensors["model.layers.0.self_attn.q_proj.bias"] = Tensor::zeros({m.n_heads * m.d}, DType::F32);  // Qwen2
  save_safetensors(dir + "/model.safetensors", g);
  EXPECT_THROW(TargetModel(dir, *self), Error);
  g = f;
  g.tensors.erase("model.layers.2.mlp.up_proj.weight");
  save_safetensors(dir + "/model.safetensors", g);
  EXPECT_THROW(TargetModel(dir, *self), Error);
  g = f;
  g.tensors["model.norm.weight"] = Tensor::zeros({m.H + 1}, DType::F32);
  save_safetensors(dir + "/model.safetensors", g);
  EXPECT_THROW(TargetModel(dir, *self), Error);
}

class TargetStories : public ::testing::Test {
 protected:
  void SetUp() override {
    AERIE_REQUIRE_MODEL();
    world_ = MpiCommunicator::world();
    self_ = world_->split(world_->rank(), 0);
    model_ = std::make_unique<TargetModel>(testing::model_dir(), *self_);
  }
  std::unique_ptr<MpiCommunicator> world_, self_;
  std::unique_ptr<TargetModel> model_;
};

TEST_F(TargetStories, Config) {
  const TargetConfig& c = model_->config();
  EXPECT_EQ(c.hidden_size, 64);
  EXPECT_EQ(c.num_hidden_layers, 5);
  EXPECT_EQ(c.num_attention_heads, 8);
  EXPECT_EQ(c.num_key_value_heads, 4);
  EXPECT_EQ(c.head_dim, 8);
  EXPECT_EQ(c.intermediate_size, 172);
  EXPECT_EQ(c.vocab_size, 512);
  EXPECT_TRUE(c.tie_word_embeddings);
}

// Captures (eagle3.md section 1): shapes, r^0 = embeddings, z = final_norm(r^N), logits = z W_lm^T.
TEST_F(TargetStories, Captures) {
  const int64_t H = 64, N = 5, V = 512, n = 9;
  std::vector<int32_t> ids = some_ids(n, V, 5);
  std::vector<int> aux = default_aux_layers(N);
  TargetOutput out = model_->forward(ids, nullptr, aux, true);
  EXPECT_EQ(out.aux_hidden.shape(), (Shape{n, 3 * H}));
  EXPECT_EQ(out.final_hidden.shape(), (Shape{n, H}));
  EXPECT_EQ(out.logits.shape(), (Shape{n, V}));
  // aux (2, 2, 2): three identical copies of r^2.
  expect_close(cols(out.aux_hidden, H, 2 * H), cols(out.aux_hidden, 0, H), 0, 0, "r^2 copy 1");
  expect_close(cols(out.aux_hidden, 2 * H, 3 * H), cols(out.aux_hidden, 0, H), 0, 0, "r^2 copy 2");

  TargetOutput o2 = model_->forward(ids, nullptr, {0, static_cast<int>(N)}, false);
  EXPECT_FALSE(o2.logits.defined());
  const float* emb = model_->embed_tokens().data<float>();
  std::vector<float> r0;
  for (int32_t id : ids) r0.insert(r0.end(), emb + id * H, emb + (id + 1) * H);
  expect_close(cols(o2.aux_hidden, 0, H), r0, 0, 0, "r^0");
  // z = r^N * rsqrt(mean(r^N^2) + eps) * norm.weight, with norm.weight read from the checkpoint.
  std::vector<float> w = load_safetensors(testing::model_dir() + "/model.safetensors")
                             .tensors.at("model.norm.weight").to_float_vector();
  std::vector<float> rN = cols(o2.aux_hidden, H, 2 * H), z(n * H);
  for (int64_t t = 0; t < n; ++t) {
    double ss = 0;
    for (int64_t i = 0; i < H; ++i) ss += double(rN[t * H + i]) * rN[t * H + i];
    double rstd = 1.0 / std::sqrt(ss / H + model_->config().rms_norm_eps);
    for (int64_t i = 0; i < H; ++i) z[t * H + i] = static_cast<float>(rN[t * H + i] * rstd * w[i]);
  }
  expect_close(out.final_hidden.to_float_vector(), z, 1e-5f, 1e-5f, "z = final_norm(r^N)");
  std::vector<float> logits(n * V);
  const float* lm = model_->lm_head().data<float>();
  for (int64_t t = 0; t < n; ++t)
    for (int64_t v = 0; v < V; ++v) {
      double s = 0;
      for (int64_t i = 0; i < H; ++i) s += double(z[t * H + i]) * lm[v * H + i];
      logits[t * V + v] = static_cast<float>(s);
    }
  expect_close(out.logits.to_float_vector(), logits, 1e-4f, 1e-4f, "logits = z W_lm^T");
  EXPECT_THROW(model_->forward(ids, nullptr, {6}, false), Error);
}

// A prefill of T tokens equals token-by-token decoding with the KV cache, and a chunked prefill
// (cache positions continue from the cache length). Same fp32 math in a different grouping: 2e-5.
TEST_F(TargetStories, PrefillEqualsCachedDecoding) {
  const int64_t T = 24, V = 512;
  std::vector<int32_t> ids = some_ids(T, V, 11);
  TargetOutput full = model_->forward(ids, nullptr, {1, 3, 5}, true);

  KVCache cache = model_->make_cache(T);
  for (int64_t t = 0; t < T; ++t) {
    TargetOutput o = model_->forward({ids[t]}, &cache, {1, 3, 5}, true);
    EXPECT_EQ(cache.length(), t + 1);
    expect_close(o.logits.to_float_vector(), row_range(full.logits, t, t + 1), 2e-5f, 2e-5f,
                 "logits at " + std::to_string(t));
    expect_close(o.aux_hidden.to_float_vector(), row_range(full.aux_hidden, t, t + 1), 2e-5f, 2e-5f, "aux");
  }
  EXPECT_THROW(model_->forward({ids[0]}, &cache, {}, true), Error);  // cache full

  KVCache chunked = model_->make_cache(T);
  model_->forward(std::vector<int32_t>(ids.begin(), ids.begin() + 10), &chunked, {}, false);
  TargetOutput rest = model_->forward(std::vector<int32_t>(ids.begin() + 10, ids.end()), &chunked, {}, true);
  expect_close(rest.logits.to_float_vector(), row_range(full.logits, 10, T), 2e-5f, 2e-5f, "chunked");
  expect_close(rest.final_hidden.to_float_vector(), row_range(full.final_hidden, 10, T), 2e-5f, 2e-5f, "z");
}

// Rejected draft tokens: truncate() drops them, and decoding other tokens gives what a fresh prefill of
// the accepted prefix + the other tokens gives.
TEST_F(TargetStories, TruncateDropsRejectedTokens) {
  std::vector<int32_t> prefix = some_ids(12, 512, 21), a = {40, 41, 42, 43}, b = {300, 301, 302};
  KVCache cache = model_->make_cache(20);
  model_->forward(prefix, &cache, {}, false);
  model_->forward(a, &cache, {}, true);
  EXPECT_EQ(cache.length(), 16);
  EXPECT_THROW(cache.truncate(17), Error);
  cache.truncate(12);
  TargetOutput got = model_->forward(b, &cache, {}, true);
  std::vector<int32_t> all = prefix;
  all.insert(all.end(), b.begin(), b.end());
  TargetOutput want = model_->forward(all, nullptr, {}, true);
  expect_close(got.logits.to_float_vector(), row_range(want.logits, 12, 15), 2e-5f, 2e-5f, "after truncate");
}

}  // namespace
}  // namespace aerie
