// The softmax-router MoE targets against Hugging Face transformers: one small random model per family, made
// and saved by transformers itself (tools/reference/make_moe_fixtures.py), the float64 forward as the
// reference, at the Llama families' tolerance (hf_reference.h; fp32 against float64):
//   hf/qwen3_moe  Qwen3-MoE: q/k norms, layer 0 dense (mlp_only_layers), layers 1-2 MoE (8 experts, top 2,
//                 norm_topk_prob true)
//   hf/mixtral    Mixtral: sliding_window 8 < T, every layer MoE (4 experts, top 2), the checkpoints'
//                 block_sparse_moe.experts.{e}.w1/w2/w3 names
// Also: each family's config fields, the routers on the reference's own gate logits, and bad configs named.
// The routers' smallest margin in these fixtures (the K-th probability minus the next) is in the reference's
// metadata (3e-6 for qwen3_moe): far above fp32's rounding of probabilities of O(0.1).
#include <fstream>

#include "comm/communicator.h"
#include "hf_reference.h"
#include "io/safetensors.h"
#include "kernels/moe_router.h"
#include "model/target.h"
#include "model_testing.h"
#include "test_util.h"

namespace aerie {
namespace {

using testing::compare_with_reference;
using testing::fixture;
using testing::self_comm;

/// The routers of every MoE layer of `name`'s reference on its own gate logits: the experts exactly, the
/// weights to a few ulp.
void check_routers(const std::string& name, const TargetConfig& c) {
  const SafetensorsFile ref = load_safetensors(fixture(name) + "/reference.safetensors");
  int layers = 0;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    if (!c.moe.is_moe_layer(l)) continue;
    ++layers;
    const std::string p = "router." + std::to_string(l) + ".";
    const Tensor& logits = ref.tensors.at(p + "logits");
    const int64_t t = logits.dim(0), k = c.moe.num_experts_per_tok;
    MoeRouterConfig rc;
    rc.top_k = k;
    rc.norm_topk_prob = c.moe.norm_topk_prob;
    Tensor idx = Tensor::empty({t, k}, DType::I32), w = Tensor::empty({t, k}, DType::F32);
    moe_router(c.moe.router, logits, Tensor(), rc, idx, w);
    const Tensor& want = ref.tensors.at(p + "indices");
    EXPECT_TRUE(std::equal(idx.data<int32_t>(), idx.data<int32_t>() + t * k, want.data<int32_t>())) << name << " " << p;
    testing::expect_close(w.to_float_vector(), ref.tensors.at(p + "weights").to_float_vector(), 0.0f, 1e-6f,
                          name + " " + p + "weights");
  }
  EXPECT_GE(layers, 1) << name;
}

/// load_target_config of a minimal `model_type` config with `extra` merged over it.
TargetConfig moe_config_with(const std::string& model_type, const nlohmann::json& extra) {
  nlohmann::json j = {{"model_type", model_type}, {"hidden_size", 64},   {"intermediate_size", 96},
                      {"num_hidden_layers", 4},   {"num_attention_heads", 4}, {"vocab_size", 300}};
  for (auto& [k, v] : extra.items()) j[k] = v;
  const std::string dir = testing::scratch_dir("moe_config");
  std::ofstream(dir + "/config.json") << j.dump();
  return load_target_config(dir);
}

TEST(Qwen3Moe, ConfigFields) {
  const TargetConfig c = load_target_config(fixture("qwen3_moe"));
  EXPECT_EQ(c.moe.router, MoeRouterKind::SoftmaxTopK);
  EXPECT_EQ(c.moe.n_routed_experts, 8);
  EXPECT_EQ(c.moe.num_experts_per_tok, 2);
  EXPECT_EQ(c.moe.moe_intermediate_size, 32);
  EXPECT_EQ(c.moe.n_shared_experts, 0);
  EXPECT_TRUE(c.moe.norm_topk_prob);
  EXPECT_EQ(c.moe.layers, (std::vector<bool>{false, true, true}));
  EXPECT_TRUE(c.qk_norm);
  EXPECT_EQ(c.head_dim, 32);
  // Qwen3MoeConfig's defaults: norm_topk_prob false, decoder_sparse_step 1; a step of 2 makes layers 1, 3 MoE.
  const TargetConfig d = moe_config_with("qwen3_moe", {{"num_experts", 4}, {"num_experts_per_tok", 2},
                                                       {"moe_intermediate_size", 16}, {"decoder_sparse_step", 2}});
  EXPECT_FALSE(d.moe.norm_topk_prob);
  EXPECT_EQ(d.moe.layers, (std::vector<bool>{false, true, false, true}));
  EXPECT_EQ(d.max_position_embeddings, 32768);
}

TEST(Qwen3Moe, RoutersMatchTransformers) { check_routers("qwen3_moe", load_target_config(fixture("qwen3_moe"))); }

TEST(Qwen3Moe, MatchesTransformers) {
  auto self = self_comm();
  TargetModel model(fixture("qwen3_moe"), *self);
  compare_with_reference(model, fixture("qwen3_moe") + "/reference.safetensors");
}

TEST(Qwen3Moe, BadConfigsAreNamed) {
  const nlohmann::json ok = {{"num_experts", 4}, {"num_experts_per_tok", 2}, {"moe_intermediate_size", 16}};
  auto with = [&](const nlohmann::json& change) {
    nlohmann::json j = ok;
    for (auto& [k, v] : change.items()) j[k] = v;
    return testing::error_of([&] { moe_config_with("qwen3_moe", j); });
  };
  EXPECT_NE(with({{"num_experts_per_tok", 5}}).find("num_experts_per_tok 5"), std::string::npos);
  EXPECT_NE(with({{"mlp_only_layers", {7}}}).find("mlp_only_layers entry 7"), std::string::npos);
  EXPECT_NE(with({{"decoder_sparse_step", 0}}).find("decoder_sparse_step"), std::string::npos);
  nlohmann::json missing = ok;
  missing.erase("moe_intermediate_size");
  EXPECT_NE(testing::error_of([&] { moe_config_with("qwen3_moe", missing); }).find("\"moe_intermediate_size\""),
            std::string::npos);
}

TEST(Mixtral, ConfigFields) {
  const TargetConfig c = load_target_config(fixture("mixtral"));
  EXPECT_EQ(c.moe.router, MoeRouterKind::SoftmaxTopK);
  EXPECT_EQ(c.moe.n_routed_experts, 4);
  EXPECT_EQ(c.moe.num_experts_per_tok, 2);
  EXPECT_EQ(c.moe.moe_intermediate_size, 48);
  EXPECT_TRUE(c.moe.norm_topk_prob);
  EXPECT_EQ(c.moe.layers, (std::vector<bool>{true, true}));
  EXPECT_EQ(c.sliding_window, 8);
  EXPECT_EQ(c.sliding_layers, (std::vector<bool>{true, true}));
  const TargetConfig d = moe_config_with("mixtral", {});  // MixtralConfig's defaults: 8 experts, top 2
  EXPECT_EQ(d.moe.n_routed_experts, 8);
  EXPECT_EQ(d.moe.num_experts_per_tok, 2);
  EXPECT_EQ(d.max_position_embeddings, 131072);
  EXPECT_NE(testing::error_of([&] { moe_config_with("mixtral", {{"num_experts_per_tok", 9}}); })
                .find("num_experts_per_tok 9"),
            std::string::npos);
}

TEST(Mixtral, RoutersMatchTransformers) { check_routers("mixtral", load_target_config(fixture("mixtral"))); }

TEST(Mixtral, MatchesTransformers) {
  auto self = self_comm();
  TargetModel model(fixture("mixtral"), *self);
  compare_with_reference(model, fixture("mixtral") + "/reference.safetensors");
  compare_with_reference(model, fixture("mixtral") + "/reference.safetensors", 13);  // a split past the window
}

TEST(MoeFamiliesCuda, F32MatchesTransformers) {
  AERIE_REQUIRE_CUDA();
  auto self = self_comm();
  for (const std::string name : {"qwen3_moe", "mixtral"}) {
    SCOPED_TRACE(name);
    TargetModel model(fixture(name), *self, {Device::CUDA, DType::F32});
    ASSERT_EQ(model.device(), Device::CUDA);
    compare_with_reference(model, fixture(name) + "/reference.safetensors");
  }
}

}  // namespace
}  // namespace aerie
