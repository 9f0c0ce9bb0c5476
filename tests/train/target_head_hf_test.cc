// load_target_head on the Hugging Face checkpoints of tests/model/fixtures/hf (made by
// tools/reference/make_hf_fixtures.py): sharded F16, tied, and a multimodal wrapper's names.
#include <filesystem>
#include <fstream>

#include "io/safetensors.h"
#include "test_util.h"
#include "train/target_head.h"

namespace aerie {
namespace {

std::string fixture(const std::string& name) {
  return std::string(AERIE_SOURCE_DIR) + "/tests/model/fixtures/hf/" + name;
}

/// Tensor `name` of a sharded checkpoint as stored, widened to fp32.
std::vector<float> stored(const std::string& dir, const std::string& name) {
  nlohmann::json j;
  std::ifstream(dir + "/model.safetensors.index.json") >> j;
  return load_safetensors(dir + "/" + j["weight_map"][name].get<std::string>()).tensors.at(name).to_float_vector();
}

TEST(TargetHeadHf, ShardedF16) {
  const std::string dir = fixture("llama2_linear");
  TargetConfig c = load_target_config(dir);
  TargetHead h = load_target_head(dir, c);
  EXPECT_EQ(h.embed_tokens.dtype(), DType::F32);
  EXPECT_EQ(h.embed_tokens.to_float_vector(), stored(dir, "model.embed_tokens.weight"));
  EXPECT_EQ(h.lm_head.to_float_vector(), stored(dir, "lm_head.weight"));
  EXPECT_NE(h.lm_head.raw(), h.embed_tokens.raw());
  EXPECT_EQ(h.lm_head_stored, DType::F16);  // what the train job keeps on a GPU in BF16 only when it is BF16
}

TEST(TargetHeadHf, RecordsTheStoredDtypeOfWlm) {
  SafetensorsFile f = load_safetensors(fixture("qwen2") + "/model.safetensors");
  f.tensors.at("lm_head.weight") = f.tensors.at("lm_head.weight").to(DType::BF16);
  const std::string dir = testing::scratch_dir("target_head_bf16");
  save_safetensors(dir + "/model.safetensors", f);
  std::filesystem::copy_file(fixture("qwen2") + "/config.json", dir + "/config.json",
                             std::filesystem::copy_options::overwrite_existing);
  TargetHead h = load_target_head(dir, load_target_config(dir));
  EXPECT_EQ(h.lm_head_stored, DType::BF16);
  EXPECT_EQ(h.lm_head.dtype(), DType::F32);  // widened on the host, exactly
  EXPECT_EQ(h.lm_head.to_float_vector(), f.tensors.at("lm_head.weight").to_float_vector());
}

TEST(TargetHeadHf, TiedSharesStorage) {
  TargetConfig c = load_target_config(fixture("qwen3"));
  TargetHead h = load_target_head(fixture("qwen3"), c);
  EXPECT_EQ(h.lm_head.raw(), h.embed_tokens.raw());
  EXPECT_EQ(h.embed_tokens.shape(), (Shape{300, 64}));
}

TEST(TargetHeadHf, MultimodalWrapperAndMissingHead) {
  SafetensorsFile f = load_safetensors(fixture("qwen2") + "/model.safetensors"), g;
  for (auto& [name, t] : f.tensors)
    g.tensors[name == "lm_head.weight" ? "language_model.lm_head.weight" : "language_model." + name] = t;
  g.tensors["vision_tower.w"] = Tensor::zeros({2}, DType::F32);
  const std::string dir = testing::scratch_dir("target_head_wrapper");
  save_safetensors(dir + "/model.safetensors", g);
  nlohmann::json text;
  std::ifstream(fixture("qwen2") + "/config.json") >> text;
  std::ofstream(dir + "/config.json") << nlohmann::json{{"model_type", "llava"}, {"text_config", text}}.dump();
  TargetConfig c = load_target_config(dir);
  TargetHead h = load_target_head(dir, c);
  EXPECT_EQ(h.lm_head.to_float_vector(), f.tensors.at("lm_head.weight").to_float_vector());
  EXPECT_EQ(h.embed_tokens.to_float_vector(), f.tensors.at("model.embed_tokens.weight").to_float_vector());

  g.tensors.erase("language_model.lm_head.weight");
  save_safetensors(dir + "/model.safetensors", g);
  const std::string e = testing::error_of([&] { load_target_head(dir, c); });
  EXPECT_NE(e.find("lm_head.weight"), std::string::npos) << e;
  EXPECT_NE(e.find(dir + "/model.safetensors"), std::string::npos) << e;
}

}  // namespace
}  // namespace aerie
