// TargetModel against Hugging Face transformers on one small random model per supported family, made and
// saved by transformers itself (tools/reference/make_hf_fixtures.py; the models and what each exercises
// are listed there), with the float64 forward of transformers as the reference:
//   hf/llama3_tied    F32, llama3 rope_scaling, head_dim != H/heads, tied embeddings
//   hf/llama2_linear  F16, 4 shards + index, linear rope_scaling (4.x spelling), q/k/v/o and MLP biases
//   hf/mistral_swa    BF16, sliding_window 8 < T = 24
//   hf/qwen2          BF16, q/k/v biases
//   hf/qwen3          BF16, q_norm/k_norm, head_dim != H/heads, tied embeddings
// Also: the multimodal wrapper layouts (checkpoints renamed from hf/qwen2 in a scratch folder), the
// loader's errors, and tensor parallelism (TpTest.*, run with 2 ranks by tests/mpi/model.cmake).
//
// Tolerance: aerie computes in fp32 what transformers computes in float64 from the same stored weights,
// so the difference is fp32 rounding only: values are O(1..10) and each is a sum of O(100) products,
// giving absolute errors of ~1e-6 to 1e-5. Measured worst over the five fixtures (OpenBLAS, x86-64):
// 9.8e-6 on the logits, 1.9e-5 on r^k. atol 1e-4 + rtol 2e-5, as tests/model/target_hf_test.cc, leaves
// 5x room for other BLAS builds and summation orders, and is far below what a wrong bias, norm, RoPE
// scaling or window changes (O(1) on these random weights).
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>

#include "comm/communicator.h"
#include "io/safetensors.h"
#include "model/target.h"
#include "model/hf_checkpoint.h"
#include "hf_reference.h"
#include "model_testing.h"
#include "test_util.h"

namespace aerie {
namespace {

using testing::self_comm;

namespace fs = std::filesystem;
using testing::cols;
using testing::compare_with_reference;
using testing::fixture;
using testing::kAtol;
using testing::kRtol;

void compare_fixture(const std::string& name) {
  auto self = self_comm();
  TargetModel model(fixture(name), *self);
  compare_with_reference(model, fixture(name) + "/reference.safetensors");
}

TEST(TargetHfFamilies, Llama3TiedF32) {
  TargetConfig c = load_target_config(fixture("llama3_tied"));
  EXPECT_EQ(c.rope.type, "llama3");
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_EQ(c.head_dim, 32);  // != hidden 64 / 4 heads
  EXPECT_FALSE(c.qkv_bias || c.o_bias || c.mlp_bias || c.qk_norm);
  compare_fixture("llama3_tied");
}

TEST(TargetHfFamilies, Llama2LinearRopeF16ShardedWithBiases) {
  TargetConfig c = load_target_config(fixture("llama2_linear"));
  EXPECT_EQ(c.rope.type, "linear");  // from the transformers 4.x "rope_scaling": {"type": "linear"}
  EXPECT_DOUBLE_EQ(c.rope.factor, 2.0);
  EXPECT_TRUE(c.qkv_bias && c.o_bias && c.mlp_bias);
  ASSERT_TRUE(fs::exists(fixture("llama2_linear") + "/model.safetensors.index.json"));
  compare_fixture("llama2_linear");
}

TEST(TargetHfFamilies, MistralSlidingWindow) {
  TargetConfig c = load_target_config(fixture("mistral_swa"));
  EXPECT_EQ(c.sliding_window, 8);
  EXPECT_EQ(c.sliding_layers, std::vector<bool>(2, true));
  auto self = self_comm();
  TargetModel model(fixture("mistral_swa"), *self);
  // Prefill splits before (5) and after (13) the window: both paths of the windowed attention.
  compare_with_reference(model, fixture("mistral_swa") + "/reference.safetensors", 5);
  compare_with_reference(model, fixture("mistral_swa") + "/reference.safetensors", 13);
}

TEST(TargetHfFamilies, Qwen2AttentionBiases) {
  TargetConfig c = load_target_config(fixture("qwen2"));
  EXPECT_TRUE(c.qkv_bias);
  EXPECT_FALSE(c.o_bias || c.mlp_bias || c.qk_norm);
  EXPECT_EQ(c.sliding_window, 0);  // use_sliding_window false
  compare_fixture("qwen2");
}

TEST(TargetHfFamilies, Qwen3QkNorm) {
  TargetConfig c = load_target_config(fixture("qwen3"));
  EXPECT_TRUE(c.qk_norm);
  EXPECT_EQ(c.head_dim, 32);
  EXPECT_TRUE(c.tie_word_embeddings);
  compare_fixture("qwen3");
}

/// load_target_config of `extra` merged over a minimal config.
TargetConfig config_with(const nlohmann::json& extra) {
  nlohmann::json j = {{"hidden_size", 64}, {"intermediate_size", 96}, {"num_hidden_layers", 4},
                      {"num_attention_heads", 4}, {"vocab_size", 300}};
  for (auto& [k, v] : extra.items()) j[k] = v;
  const std::string dir = testing::scratch_dir("hf_config");
  std::ofstream(dir + "/config.json") << j.dump();
  return load_target_config(dir);
}

TEST(TargetHfFamilies, MaxPositionEmbeddingsDefaultsPerFamily) {
  // Without the field: transformers' config class default (5.24), not Llama's 2048 for every family.
  EXPECT_EQ(config_with({{"model_type", "llama"}}).max_position_embeddings, 2048);
  EXPECT_EQ(config_with({{"model_type", "mistral"}}).max_position_embeddings, 131072);
  EXPECT_EQ(config_with({{"model_type", "qwen2"}}).max_position_embeddings, 32768);
  EXPECT_EQ(config_with({{"model_type", "qwen3"}}).max_position_embeddings, 32768);
  EXPECT_EQ(config_with({{"model_type", "qwen3"}, {"max_position_embeddings", 40960}}).max_position_embeddings, 40960);
}

TEST(TargetHfFamilies, ConfigFieldsPerFamily) {
  // Qwen2 as transformers 4.x wrote it: a sliding_window that use_sliding_window false switches off.
  TargetConfig c = config_with({{"model_type", "qwen2"}, {"sliding_window", 4096}, {"use_sliding_window", false},
                               {"max_window_layers", 2}});
  EXPECT_EQ(c.sliding_window, 0);
  EXPECT_TRUE(c.qkv_bias);
  EXPECT_FALSE(c.o_bias);
  // ... switched on: layers >= max_window_layers, or as layer_types says.
  c = config_with({{"model_type", "qwen2"}, {"sliding_window", 16}, {"use_sliding_window", true},
                   {"max_window_layers", 2}});
  EXPECT_EQ(c.sliding_window, 16);
  EXPECT_EQ(c.sliding_layers, (std::vector<bool>{false, false, true, true}));
  c = config_with({{"model_type", "qwen3"}, {"sliding_window", 16}, {"use_sliding_window", true},
                   {"layer_types", {"sliding_attention", "full_attention", "sliding_attention", "full_attention"}}});
  EXPECT_EQ(c.sliding_layers, (std::vector<bool>{true, false, true, false}));
  EXPECT_TRUE(c.qk_norm);
  // Mistral: a null window is none.
  c = config_with({{"model_type", "mistral"}, {"sliding_window", nullptr}, {"attention_bias", true}});
  EXPECT_EQ(c.sliding_window, 0);
  EXPECT_FALSE(c.qkv_bias);  // MistralAttention has no biases whatever the config says
  // Llama: attention_bias and mlp_bias; linear rope in the 5.x spelling.
  c = config_with({{"model_type", "llama"}, {"attention_bias", true}, {"mlp_bias", true},
                   {"rope_parameters", {{"rope_type", "linear"}, {"factor", 4.0}, {"rope_theta", 5e5}}}});
  EXPECT_TRUE(c.qkv_bias && c.o_bias && c.mlp_bias);
  EXPECT_EQ(c.rope.type, "linear");
  EXPECT_DOUBLE_EQ(c.rope.theta, 5e5);
  std::vector<float> inv = rope_inv_freq(c.rope, 16);
  RopeParams plain;
  plain.theta = 5e5;
  std::vector<float> base = rope_inv_freq(plain, 16);
  for (size_t i = 0; i < inv.size(); ++i) EXPECT_EQ(inv[i], base[i] / 4.0f);
  // A wrapper: fields from text_config, eos_token_id from the top level.
  nlohmann::json text = {{"model_type", "mistral"}, {"hidden_size", 32}, {"intermediate_size", 64},
                         {"num_hidden_layers", 2}, {"num_attention_heads", 2}, {"vocab_size", 100}};
  const std::string dir = testing::scratch_dir("hf_config_wrapper");
  std::ofstream(dir + "/config.json")
      << nlohmann::json{{"model_type", "mistral3"}, {"text_config", text}, {"eos_token_id", 7}}.dump();
  c = load_target_config(dir);
  EXPECT_EQ(c.model_type, "mistral");
  EXPECT_EQ(c.hidden_size, 32);
  EXPECT_EQ(c.eos_token_id, 7);
  // Refused: another activation, another rope type, another model type.
  EXPECT_THROW(config_with({{"hidden_act", "gelu"}}), Error);
  EXPECT_THROW(config_with({{"rope_scaling", {{"type", "longrope"}, {"factor", 4.0}}}}), Error);
  EXPECT_THROW(config_with({{"model_type", "gemma"}}), Error);
}

/// hf/qwen2 renamed into a multimodal wrapper in `dir`: decoder tensors under `prefix`, the lm_head as
/// `head`, a vision tensor beside them, and config.json with the text model under "text_config".
void write_wrapped_qwen2(const std::string& dir, const std::string& prefix, const std::string& head) {
  SafetensorsFile f = load_safetensors(fixture("qwen2") + "/model.safetensors"), g;
  for (auto& [name, t] : f.tensors) {
    if (name == "lm_head.weight") g.tensors[head] = t;
    else g.tensors[prefix + name.substr(6)] = t;  // drop "model."
  }
  g.tensors["model.vision_tower.patch_embed.weight"] = Tensor::zeros({4, 3}, DType::F32);
  save_safetensors(dir + "/model.safetensors", g);
  nlohmann::json text;
  std::ifstream(fixture("qwen2") + "/config.json") >> text;
  nlohmann::json wrapper = {{"architectures", {"LlavaForConditionalGeneration"}}, {"model_type", "llava"},
                            {"text_config", text}, {"vision_config", {{"hidden_size", 3}}}};
  std::ofstream(dir + "/config.json") << wrapper.dump(2);
}

TEST(TargetHfFamilies, MultimodalWrapperPrefixes) {
  const std::vector<std::pair<std::string, std::string>> layouts = {
      {"model.language_model.", "lm_head.weight"},                 // transformers 5
      {"language_model.model.", "language_model.lm_head.weight"}};  // transformers 4
  for (const auto& [prefix, head] : layouts) {
    SCOPED_TRACE(prefix);
    const std::string dir = testing::scratch_dir("hf_wrapper");
    write_wrapped_qwen2(dir, prefix, head);
    TargetConfig c = load_target_config(dir);
    EXPECT_EQ(c.model_type, "qwen2");
    EXPECT_TRUE(c.qkv_bias);
    EXPECT_EQ(c.hidden_size, 64);
    auto self = self_comm();
    TargetModel model(dir, *self);
    compare_with_reference(model, fixture("qwen2") + "/reference.safetensors");
  }
}

/// Copies fixture `name` to a scratch folder.
std::string copy_fixture(const std::string& name, const std::string& scratch) {
  const std::string dir = testing::scratch_dir(scratch);
  for (const auto& e : fs::directory_iterator(fixture(name))) fs::copy_file(e.path(), dir + "/" + e.path().filename().string());
  return dir;
}

/// Rewrites `file` with `edit` applied to its tensors.
void edit_file(const std::string& file, const std::function<void(SafetensorsFile&)>& edit) {
  SafetensorsFile f = load_safetensors(file);
  edit(f);
  save_safetensors(file, f);
}

/// The error message of building a TargetModel on `dir` (empty if none).
std::string load_error(const std::string& dir) {
  return testing::error_of([&] {
    auto self = self_comm();
    TargetModel m(dir, *self);
  });
}

/// The shard of `dir`'s index holding `name`.
std::string shard_of(const std::string& dir, const std::string& name) {
  nlohmann::json j;
  std::ifstream(dir + "/model.safetensors.index.json") >> j;
  return j["weight_map"][name].get<std::string>();
}

TEST(TargetHfFamilies, LoaderErrorsNameTensorAndFile) {
  // A tensor the index lists but its shard lacks.
  std::string dir = copy_fixture("llama2_linear", "hf_err_missing_sharded");
  std::string name = "model.layers.1.self_attn.v_proj.bias", shard = shard_of(dir, name);
  edit_file(dir + "/" + shard, [&](SafetensorsFile& f) { f.tensors.erase(name); });
  std::string e = load_error(dir);
  EXPECT_NE(e.find(name), std::string::npos) << e;
  EXPECT_NE(e.find(shard), std::string::npos) << e;

  // A tensor absent from the index and its shards.
  dir = copy_fixture("llama2_linear", "hf_err_missing_index");
  name = "model.layers.0.mlp.down_proj.bias";
  shard = shard_of(dir, name);
  edit_file(dir + "/" + shard, [&](SafetensorsFile& f) { f.tensors.erase(name); });
  {
    nlohmann::json j;
    std::ifstream(dir + "/model.safetensors.index.json") >> j;
    j["weight_map"].erase(name);
    std::ofstream(dir + "/model.safetensors.index.json") << j.dump();
  }
  e = load_error(dir);
  EXPECT_NE(e.find(name), std::string::npos) << e;
  EXPECT_NE(e.find("model.safetensors.index.json"), std::string::npos) << e;

  // A misshapen weight in a sharded checkpoint.
  dir = copy_fixture("llama2_linear", "hf_err_shape_sharded");
  name = "model.layers.0.self_attn.q_proj.weight";
  shard = shard_of(dir, name);
  edit_file(dir + "/" + shard, [&](SafetensorsFile& f) { f.tensors[name] = Tensor::zeros({64, 63}, DType::F16); });
  e = load_error(dir);
  EXPECT_NE(e.find(name), std::string::npos) << e;
  EXPECT_NE(e.find(shard), std::string::npos) << e;
  EXPECT_NE(e.find("[64, 63]"), std::string::npos) << e;

  // A missing shard file.
  dir = copy_fixture("llama2_linear", "hf_err_missing_shard");
  shard = shard_of(dir, "model.norm.weight");
  fs::remove(dir + "/" + shard);
  e = load_error(dir);
  EXPECT_NE(e.find(shard), std::string::npos) << e;

  // Qwen2 without a q/k/v bias; a misshapen q_norm in Qwen3 (single files).
  dir = copy_fixture("qwen2", "hf_err_qwen2_bias");
  name = "model.layers.2.self_attn.k_proj.bias";
  edit_file(dir + "/model.safetensors", [&](SafetensorsFile& f) { f.tensors.erase(name); });
  e = load_error(dir);
  EXPECT_NE(e.find(name), std::string::npos) << e;
  EXPECT_NE(e.find("model.safetensors"), std::string::npos) << e;
  dir = copy_fixture("qwen3", "hf_err_qwen3_norm");
  name = "model.layers.1.self_attn.q_norm.weight";
  edit_file(dir + "/model.safetensors", [&](SafetensorsFile& f) { f.tensors[name] = Tensor::zeros({16}, DType::BF16); });
  e = load_error(dir);
  EXPECT_NE(e.find(name), std::string::npos) << e;
  EXPECT_NE(e.find(dir + "/model.safetensors"), std::string::npos) << e;

  // Qwen3 weights under a Llama config: q_norm is not accounted for (another architecture).
  dir = copy_fixture("qwen3", "hf_err_qwen3_as_llama");
  {
    nlohmann::json j;
    std::ifstream(dir + "/config.json") >> j;
    j["model_type"] = "llama";
    std::ofstream(dir + "/config.json") << j.dump();
  }
  e = load_error(dir);
  EXPECT_NE(e.find("_norm.weight\" [32] is not part of a llama decoder"), std::string::npos) << e;

  // An unsupported model_type is refused by the config reader.
  {
    nlohmann::json j;
    std::ifstream(dir + "/config.json") >> j;
    j["model_type"] = "gemma";
    std::ofstream(dir + "/config.json") << j.dump();
  }
  e = load_error(dir);
  EXPECT_NE(e.find("gemma"), std::string::npos) << e;
}

TEST(TargetHfFamilies, F16Conversion) {
  // Exact binary16 values, a tie that rounds to even, overflow to inf, subnormals.
  const std::vector<float> in = {1.0f, -2.5f, 65504.0f, 1.0f + 0x1.0p-11f, 1.0f + 3 * 0x1.0p-11f, 65520.0f,
                                 0x1.0p-24f, 3 * 0x1.0p-25f, 0x1.0p-14f, -0.0f};
  const std::vector<float> want = {1.0f, -2.5f, 65504.0f, 1.0f, 1.0f + 0x1.0p-9f, INFINITY,
                                   0x1.0p-24f, 0x1.0p-23f, 0x1.0p-14f, -0.0f};
  Tensor h = Tensor::from_vector(in, {static_cast<int64_t>(in.size())}).to(DType::F16);
  EXPECT_EQ(h.dtype(), DType::F16);
  EXPECT_EQ(h.nbytes(), 2 * in.size());
  EXPECT_EQ(h.to_float_vector(), want);
  EXPECT_EQ(static_cast<const uint16_t*>(h.raw())[0], 0x3c00);  // 1.0 in IEEE binary16
  EXPECT_EQ(dtype_from_name("F16"), DType::F16);
  const std::string path = testing::scratch_dir("f16_safetensors") + "/h.safetensors";
  SafetensorsFile f;
  f.tensors["h"] = h;
  save_safetensors(path, f);
  SafetensorsReader reader(path);
  EXPECT_EQ(reader.entries().at("h").dtype, DType::F16);
  EXPECT_EQ(reader.read_rows("h", 3, 6).to_float_vector(), std::vector<float>(want.begin() + 3, want.begin() + 6));
  EXPECT_EQ(h.to(DType::BF16).to_float_vector(), (std::vector<float>{1.0f, -2.5f, 65536.0f, 1.0f, 1.0f, INFINITY,
                                                                     0x1.0p-24f, 0x1.0p-23f, 0x1.0p-14f, -0.0f}));
}

// Tensor parallelism over all world ranks (run with 2 by tests/mpi/model.cmake): the split model must
// match transformers as the unsplit one does (biases of the column-parallel q/k/v/gate/up are sharded,
// o/down biases and q/k norms replicated).
TEST(TpTest, HfFamiliesMatchTransformers) {
  auto world = MpiCommunicator::world();
  if (world->size() < 2) GTEST_SKIP() << "needs mpirun -np 2";
  if (2 % world->size() != 0) GTEST_SKIP() << "the fixtures' 2 kv heads do not split over " << world->size();
  for (const char* name : {"llama2_linear", "mistral_swa", "qwen2", "qwen3"}) {
    SCOPED_TRACE(name);
    TargetModel model(fixture(name), *world);
    compare_with_reference(model, fixture(name) + "/reference.safetensors");
  }
}

// Fewer kv heads than ranks: at tp 4 the fixtures' 2 kv heads are each replicated over 2 ranks (rank r
// holds kv head r / 2), q/k/v biases (llama2_linear, qwen2), q/k norms (qwen3) and MoE layers (qwen3_moe)
// included; run with 4 ranks by tests/mpi/model.cmake (model_tp4_replicated_kv).
TEST(TpTest, ReplicatedKvHeadsMatchTransformers) {
  auto world = MpiCommunicator::world();
  if (world->size() != 4) GTEST_SKIP() << "needs mpirun -np 4";
  for (const char* name : {"llama2_linear", "mistral_swa", "qwen2", "qwen3", "qwen3_moe"}) {
    SCOPED_TRACE(name);
    TargetModel model(fixture(name), *world);
    compare_with_reference(model, fixture(name) + "/reference.safetensors");
  }
}

// ------------------------------------------------------------------------------------------ on the GPU
// The same fixtures and references with the model on CUDA (TargetModelOptions), skipped without a GPU.
//  - F32 mode: every GEMM is true fp32 on cuBLASLt (CUBLAS_COMPUTE_32F, no TF32) and the kernels
//    accumulate in fp32, so the GPU differs from transformers' float64 by fp32 rounding only, as the CPU
//    does (summation orders differ, magnitudes do not): the CPU tolerance above, kAtol / kRtol.
//  - BF16 mode: weights and the GEMM inputs are rounded to bf16 (8 significant bits, u = 2^-9), about 7
//    roundings per layer (h, q, k, v, attention out, g*u, h again; model/target.h TargetModelOptions) plus
//    the weights of the F16 fixture (llama2_linear: 11 -> 8 bits). Independent rounding errors add like a
//    random walk, so a hidden state after N layers is off by about sqrt(7 N) u ~ 1e-2 relative for these
//    2-4 layer models. Measured with the CPU's BF16 mode against these references (Bf16CpuNearTransformers):
//    z and logits 0.7e-2 (qwen3) to 2.1e-2 (qwen2), r^k below that. Elementwise bounds would fail on
//    elements near zero, whose relative error is unbounded, so each output is bounded in relative L2 norm,
//    ||got - ref|| / ||ref|| <= kBf16RelL2 = 4e-2 (the bound of tests/model/target_cuda_test.cc: 2x the
//    worst measured, for the GPU's other fp32 summation orders); a wrong bias, norm, rope or window is O(1).

constexpr double kBf16RelL2 = 4e-2;

double rel_l2(const std::vector<float>& got, const std::vector<float>& ref) {
  EXPECT_EQ(got.size(), ref.size());
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size() && i < got.size(); ++i) {
    const double d = static_cast<double>(got[i]) - ref[i];
    num += d * d;
    den += static_cast<double>(ref[i]) * ref[i];
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

/// compare_with_reference for a BF16 model: every r^k, z, the prefill logits and the logits of KV-cache
/// decoding (prefill of `split` ids, then one token at a time) within kBf16RelL2 of transformers.
void compare_with_reference_bf16(TargetModel& model, const std::string& reference, int64_t split = 5) {
  SafetensorsFile ref = load_safetensors(reference);
  const std::vector<int32_t> ids = testing::reference_ids(ref);
  const int N = static_cast<int>(model.config().num_hidden_layers);
  const int64_t H = model.config().hidden_size, V = model.config().vocab_size, T = static_cast<int64_t>(ids.size());
  TargetOutput out = model.forward(ids, nullptr, testing::every_layer(model), true);
  EXPECT_EQ(out.aux_hidden.dtype(), DType::BF16);
  const Tensor& r = ref.tensors.at("r");
  ASSERT_EQ(r.shape(), (Shape{N + 1, T, H}));
  for (int k = 0; k <= N; ++k)
    EXPECT_LE(rel_l2(cols(out.aux_hidden, k * H, (k + 1) * H), r.slice(k, k + 1).to_float_vector()), kBf16RelL2)
        << reference << ": r^" << k;
  EXPECT_LE(rel_l2(out.final_hidden.to_float_vector(), ref.tensors.at("z").to_float_vector()), kBf16RelL2)
      << reference << ": z";
  const std::vector<float> logits = ref.tensors.at("logits").to_float_vector();
  EXPECT_LE(rel_l2(out.logits.to_float_vector(), logits), kBf16RelL2) << reference << ": logits";

  KVCache cache = model.make_cache(T);
  std::vector<float> cached =
      model.forward(std::vector<int32_t>(ids.begin(), ids.begin() + split), &cache, {}, true).logits.to_float_vector();
  for (int64_t t = split; t < T; ++t) {
    std::vector<float> row = model.forward({ids[t]}, &cache, {}, true).logits.to_float_vector();
    ASSERT_EQ(static_cast<int64_t>(row.size()), V);
    cached.insert(cached.end(), row.begin(), row.end());
  }
  EXPECT_LE(rel_l2(cached, logits), kBf16RelL2) << reference << ": KV-cache logits (split " << split << ")";
}

const std::vector<std::string> kCudaFamilies = {"llama3_tied", "llama2_linear", "mistral_swa", "qwen2", "qwen3"};

// The BF16 mode on the CPU (widened kernels, the same rounding points as on CUDA) against transformers:
// runs without a GPU, so the bound and the helper are checked here too.
TEST(TargetHfFamilies, Bf16CpuNearTransformers) {
  auto self = self_comm();
  for (const std::string& name : kCudaFamilies) {
    SCOPED_TRACE(name);
    TargetModel model(fixture(name), *self, {Device::CPU, DType::BF16});
    compare_with_reference_bf16(model, fixture(name) + "/reference.safetensors");
  }
}

TEST(TargetHfFamiliesCuda, F32MatchesTransformers) {
  AERIE_REQUIRE_CUDA();
  auto self = self_comm();
  for (const std::string& name : kCudaFamilies) {
    SCOPED_TRACE(name);
    TargetModel model(fixture(name), *self, {Device::CUDA, DType::F32});
    ASSERT_EQ(model.device(), Device::CUDA);
    compare_with_reference(model, fixture(name) + "/reference.safetensors");
    // Mistral: a split after the window too (both paths of the windowed attention).
    if (name == "mistral_swa") compare_with_reference(model, fixture(name) + "/reference.safetensors", 13);
  }
}

TEST(TargetHfFamiliesCuda, Bf16NearTransformers) {
  AERIE_REQUIRE_CUDA();
  auto self = self_comm();
  for (const std::string& name : kCudaFamilies) {
    SCOPED_TRACE(name);
    TargetModel model(fixture(name), *self, {Device::CUDA, DType::BF16});
    ASSERT_EQ(model.dtype(), DType::BF16);
    compare_with_reference_bf16(model, fixture(name) + "/reference.safetensors");
    if (name == "mistral_swa") compare_with_reference_bf16(model, fixture(name) + "/reference.safetensors", 13);
  }
}

}  // namespace
}  // namespace aerie
