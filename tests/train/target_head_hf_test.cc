// load_target_head on the Hugging Face checkpoints of tests/model/fixtures/hf (made by
// tools/reference/make_hf_fixtures.py): sharded F16, tied, and a multimodal wrapper's names.
#include <filesystem>
#include <fstream>

#include <random>

#include "core/bf16.h"
#include "core/device.h"
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

// make_step_samples: a step's samples made ready at once (on a GPU: one copy each way) are those make_ttt_sample
// makes one by one; hidden states read as BF16 give the same samples as F32.
TEST(StepSamples, MatchOneByOne) {
  const int64_t V = 97, H = 16;
  std::mt19937 gen(5);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  auto rnd = [&](Shape shape) {
    Tensor t = Tensor::empty(shape, DType::F32);
    for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = round_bf16(u(gen));  // bf16-exact, as a shard's
    return t;
  };
  const Tensor lm = rnd({V, H});
  const std::vector<int64_t> selected{1, 4, 9, 30, 31, 60, 96};
  std::vector<HiddenSample> hs;
  for (int64_t T : {5, 1, 9}) {
    HiddenSample h;
    for (int64_t t = 0; t < T; ++t) {
      h.ids.push_back(static_cast<int32_t>((7 * t + T) % V));
      h.loss_mask.push_back(static_cast<uint8_t>(t % 2));
    }
    h.aux_hidden = rnd({T, 3 * H});
    h.final_hidden = rnd({T, H});
    hs.push_back(h);
  }
  std::vector<Device> devices{Device::CPU};
  if (cuda::available()) devices.push_back(Device::CUDA);
  for (Device dev : devices)
    for (DType hidden : {DType::F32, DType::BF16}) {
      const Tensor head = dev == Device::CPU ? lm : lm.to(DType::BF16).to_device(dev);
      std::vector<HiddenSample> in = hs;
      for (HiddenSample& h : in) {
        h.aux_hidden = h.aux_hidden.to(hidden);
        h.final_hidden = h.final_hidden.to(hidden);
      }
      const std::vector<TTTSample> step = make_step_samples(in, head, selected, dev);
      ASSERT_EQ(step.size(), hs.size());
      for (size_t j = 0; j < hs.size(); ++j) {
        const TTTSample one = make_ttt_sample(hs[j].ids, hs[j].loss_mask, hs[j].aux_hidden, hs[j].final_hidden, head, selected);
        const std::string what = std::string(dev == Device::CPU ? "cpu" : "cuda") + " " + dtype_name(hidden) +
                                 " sample " + std::to_string(j);
        EXPECT_EQ(step[j].ids, hs[j].ids) << what;
        EXPECT_EQ(step[j].loss_mask, hs[j].loss_mask) << what;
        EXPECT_EQ(step[j].aux_hidden.device(), dev) << what;
        EXPECT_EQ(step[j].aux_hidden.to_float_vector(), hs[j].aux_hidden.to_float_vector()) << what;
        EXPECT_EQ(step[j].target_argmax, one.target_argmax) << what;
        const std::vector<float> a = step[j].target_probs.to_float_vector(), b = one.target_probs.to_float_vector();
        ASSERT_EQ(a.size(), b.size()) << what;
        for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], 1e-5f) << what << " prob " << i;
      }
    }
  // One dtype and width per step.
  std::vector<HiddenSample> mixed = hs;
  mixed[1].aux_hidden = mixed[1].aux_hidden.to(DType::BF16);
  if (cuda::available()) {
    EXPECT_NE(testing::error_of([&] { make_step_samples(mixed, lm.to(DType::BF16).to_device(Device::CUDA), selected,
                                                        Device::CUDA); })
                  .find("make_step_samples"),
              std::string::npos);
  }
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
