// The export directory (eagle3.md section 5): config keys and values copied from the target, tensor names,
// dtypes and shapes, no embed_tokens, BOOL t2d, and load_export's round trip (bf16 rounding).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include "core/error.h"
#include "core/version.h"
#include "io/safetensors.h"
#include "train/checkpoint.h"
#include "train/export.h"
#include "train/target_head.h"
#include "train/train_testing.h"

namespace aerie {
namespace {

namespace fs = std::filesystem;

// The safetensors JSON header, to see dtypes as written (load_safetensors reads BOOL as U8).
nlohmann::json safetensors_header(const std::string& path) {
  std::string bytes = read_file(path);
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  return nlohmann::json::parse(bytes.substr(8, n));
}

TEST(ExportTest, ConfigIsSection5WithTheTargetsRopeAndPositions) {
  const std::string dir = testing::scratch_dir("train_export_config");
  auto s = testing::make_tiny_setup(dir, default_aux_layers(6));
  nlohmann::json j = export_config(s.cfg, s.target);
  std::set<std::string> keys;
  for (auto& [k, v] : j.items()) keys.insert(k);
  // Exactly the keys of section 5 (hidden_act "silu" is the Llama default, stated for older loaders), and
  // aerie_version (who wrote it, issue 13 item 5; transformers keeps unknown keys, vLLM and SGLang ignore it).
  EXPECT_EQ(keys, (std::set<std::string>{"architectures", "model_type", "hidden_size", "num_attention_heads",
                                         "num_key_value_heads", "head_dim", "intermediate_size", "num_hidden_layers",
                                         "rms_norm_eps", "vocab_size", "draft_vocab_size", "max_position_embeddings",
                                         "rope_theta", "rope_scaling", "tie_word_embeddings", "torch_dtype",
                                         "hidden_act", "eagle_aux_hidden_state_layer_ids", "eagle_config",
                                         "aerie_version"}));
  EXPECT_EQ(j["aerie_version"], aerie_version_string());
  // The default aux layers named too, in both places: vLLM's capture list as aerie's ids, SGLang's
  // eagle_config list minus 1 (SGLang adds 1 to every id of a Llama-family target).
  EXPECT_EQ(j["eagle_aux_hidden_state_layer_ids"], nlohmann::json(default_aux_layers(6)));
  EXPECT_EQ(j["eagle_config"], nlohmann::json({{"eagle_aux_hidden_state_layer_ids", {1, 2, 2}}}));
  EXPECT_EQ(j["architectures"], nlohmann::json::array({"LlamaForCausalLMEagle3"}));
  EXPECT_EQ(j["model_type"], "llama");
  EXPECT_EQ(j["hidden_size"], 8);
  EXPECT_EQ(j["num_attention_heads"], 2);
  EXPECT_EQ(j["num_key_value_heads"], 1);
  EXPECT_EQ(j["head_dim"], 4);
  EXPECT_EQ(j["intermediate_size"], 12);
  EXPECT_EQ(j["num_hidden_layers"], 1);
  EXPECT_EQ(j["vocab_size"], 16);
  EXPECT_EQ(j["draft_vocab_size"], 10);
  EXPECT_EQ(j["tie_word_embeddings"], false);
  EXPECT_EQ(j["torch_dtype"], "bfloat16");
  // Copied from the target (SGLang #6783, SpecForge #249: not 2048, not without rope_scaling).
  EXPECT_EQ(j["max_position_embeddings"], 131072);
  EXPECT_EQ(j["rope_theta"], s.target.raw["rope_theta"]);
  EXPECT_EQ(j["rope_scaling"], s.target.raw["rope_scaling"]);
  EXPECT_EQ(j["rms_norm_eps"], 1e-5);

  // Non-default aux layers are named (aerie's input-of-layer-k ids).
  auto other = testing::make_tiny_setup(dir, {1, 3, 5});
  nlohmann::json jo = export_config(other.cfg, other.target);
  EXPECT_EQ(jo["eagle_config"]["eagle_aux_hidden_state_layer_ids"], nlohmann::json::array({0, 2, 4}));
  EXPECT_EQ(jo["eagle_aux_hidden_state_layer_ids"], nlohmann::json::array({1, 3, 5}));
  EXPECT_FALSE(jo.contains("target_hidden_size"));  // equal to hidden_size
  EXPECT_FALSE(jo.contains("aerie"));
  // A draft of another target is refused.
  DraftConfig bad = s.cfg;
  bad.vocab_size = 32;
  EXPECT_THROW(export_config(bad, s.target), Error);
}

// Issue 17, case 6: a target of another layer count (the same width) is refused, naming both counts; a
// draft config without the count (an older checkpoint: 0) is not checked.
TEST(ExportTest, RefusesATargetOfAnotherLayerCount) {
  const std::string dir = testing::scratch_dir("train_export_layers");
  auto s = testing::make_tiny_setup(dir, {1, 3, 5});
  TargetConfig deeper = s.target;
  deeper.num_hidden_layers = 8;
  try {
    export_config(s.cfg, deeper);
    FAIL() << "another layer count was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("export: the target has 8 layers, the draft was trained on hidden states of "
                                         "a target of 6 layers (aux layers [1,3,5])"),
              std::string::npos)
        << e.what();
  }
  DraftConfig old = s.cfg;
  old.target_num_hidden_layers = 0;
  EXPECT_NO_THROW(export_config(old, deeper));
}

// Issue 41 (the released wheels' code, src/train/serving_engines.cc): vLLM reads the top-level list as
// written; SGLang reads eagle_config's only and adds 1 to every id of a Llama-family target (so it gets
// aux - 1, which cannot name aux layer 0), and of a DeepSeek/Kimi target before 0.5.13; from 0.5.13 such a
// target adds 1 only when the first id is 1 (aux - 1 for a list starting at 2, else aux, none for 1).
TEST(ExportTest, AuxIdsAreWrittenAsEachEngineReadsThem) {
  EXPECT_EQ(serving_engine_from_string("sglang"), ServingEngine::Sglang);
  EXPECT_THROW(serving_engine_from_string("trtllm"), Error);
  const std::string dir = testing::scratch_dir("train_export_engine");
  auto s = testing::make_tiny_setup(dir, {1, 3, 5});
  write_export(dir + "/sglang", s.cfg, s.w, s.vocab, s.target, ServingEngine::Sglang);
  const nlohmann::json c = nlohmann::json::parse(read_file(dir + "/sglang/config.json"));
  EXPECT_EQ(c["eagle_config"]["eagle_aux_hidden_state_layer_ids"], nlohmann::json::array({0, 2, 4}));
  EXPECT_EQ(c["eagle_aux_hidden_state_layer_ids"], nlohmann::json::array({1, 3, 5}));
  EXPECT_EQ(load_export(dir + "/sglang", 6).config.aux_layers, (std::vector<int>{1, 3, 5}));
  // The embedding output (aux layer 0) has no SGLang id for a Llama target: refused for SGLang, a warning
  // otherwise (vLLM reads it).
  auto zero = testing::make_tiny_setup(dir, {0, 2, 4});
  const std::string no_zero = testing::error_of(
      [&] { write_export(dir + "/zero", zero.cfg, zero.w, zero.vocab, zero.target, ServingEngine::Sglang); });
  EXPECT_NE(no_zero.find("the embedding output (aux layer 0) cannot be named to it"), std::string::npos) << no_zero;
  EXPECT_FALSE(fs::exists(dir + "/zero"));
  write_export(dir + "/zero", zero.cfg, zero.w, zero.vocab, zero.target, ServingEngine::Vllm);
  // A DeepSeek-V3 target: before 0.5.13 every id + 1; from 0.5.13 the first-id rule.
  const TargetConfig ds = load_target_config(std::string(AERIE_SOURCE_DIR) + "/tests/model/fixtures/hf/deepseek_v3");
  std::vector<int> ids;
  std::string why;
  const ServingTarget old = serving_target_from_string("sglang==0.5.12"), now = serving_target_from_string("sglang==0.5.13");
  EXPECT_TRUE(eagle_config_aux_ids({1, 2, 3}, ds, old, ids, why));
  EXPECT_EQ(ids, (std::vector<int>{0, 1, 2}));
  EXPECT_TRUE(eagle_config_aux_ids({2, 3, 4}, ds, now, ids, why));  // [1, 2, 3]: +1 as the first id is 1
  EXPECT_EQ(ids, (std::vector<int>{1, 2, 3}));
  EXPECT_TRUE(eagle_config_aux_ids({0, 1, 3}, ds, now, ids, why));  // as written
  EXPECT_EQ(ids, (std::vector<int>{0, 1, 3}));
  EXPECT_FALSE(eagle_config_aux_ids({0, 1, 3}, ds, old, ids, why));
  // [1, 2, 3]: only the first id is tested and layers are captured in layer order, so [2, 1, 3] serves.
  EXPECT_TRUE(eagle_config_aux_ids({1, 2, 3}, ds, now, ids, why));
  EXPECT_EQ(ids, (std::vector<int>{2, 1, 3}));
  EXPECT_FALSE(eagle_config_aux_ids({1, 1, 1}, ds, now, ids, why));
  EXPECT_NE(why.find("would capture the inputs of layers [2,2,2]"), std::string::npos) << why;
  // vLLM and any: SGLang's newest convention in eagle_config, aerie's ids at the top level.
  EXPECT_TRUE(eagle_config_aux_ids({1, 3, 5}, s.target, ServingEngine::Vllm, ids, why));
  EXPECT_EQ(ids, (std::vector<int>{0, 2, 4}));
}

// --for ENGINE==RELEASE: parsed leniently (a missing patch, a suffix), refused when it names no release, and
// each need is checked against that release with the first one that meets it named.
TEST(ExportTest, ForAnEngineReleaseRefusesWhatThatReleaseDoesNotServe) {
  const ServingTarget v = serving_target_from_string("VLLM==0.18");
  EXPECT_EQ(v.engine, ServingEngine::Vllm);
  EXPECT_EQ(v.release, (EngineRelease{0, 18, 0}));
  EXPECT_EQ(serving_target_from_string("sglang==0.5.14.post1").release, (EngineRelease{0, 5, 14, 0, 1}));
  EXPECT_EQ(serving_target_from_string("vllm==0.10.1rc1").release, (EngineRelease{0, 10, 1}));
  EXPECT_FALSE(serving_target_from_string("vllm").has_release);
  // PEP 440's forms: a fourth number (vLLM 0.10.1.1), pre- and development releases (taken as their release, the
  // name says so), blanks.
  EXPECT_EQ(serving_target_from_string(" vllm == 0.10.1.1 ").release, (EngineRelease{0, 10, 1, 1}));
  EXPECT_TRUE((EngineRelease{0, 10, 1} < EngineRelease{0, 10, 1, 1}));
  EXPECT_TRUE(EngineRelease::parse("0.18.0.dev0").prerelease);
  EXPECT_EQ(EngineRelease::parse("0.18.0.post1.dev3"), (EngineRelease{0, 18, 0, 0, 1}));
  EXPECT_EQ(serving_target_from_string("vllm==0.18.0rc1").name(), "vLLM 0.18.0rc1 (taken as 0.18.0)");
  for (const char* bad : {"any==0.1.0", "vllm==", "vllm==x", "vllm==0", "vllm=0.18.0", "vllm==0.18.0-1",
                          "vllm==0.18.0rc", "vllm==1e3"})
    EXPECT_THROW(serving_target_from_string(bad), Error) << bad;
  EXPECT_TRUE((EngineRelease{0, 9, 2} < EngineRelease{0, 10, 0}));
  const std::string dir = testing::scratch_dir("train_export_release");
  auto s = testing::make_tiny_setup(dir, {2, 3, 4});
  s.cfg.norm_before_residual = true;
  const std::string r =
      testing::error_of([&] { write_export(dir + "/e", s.cfg, s.w, s.vocab, s.target, serving_target_from_string("vllm==0.10.0")); });
  EXPECT_NE(r.find("; and vLLM 0.10.0 does not serve norm_before_residual (EAGLE-3.1; train's default): the first "
                   "release that does is 0.10.1"),
            std::string::npos)
      << r;
  EXPECT_FALSE(fs::exists(dir + "/e"));
  EXPECT_NE(r.find("the architecture LlamaForCausalLMEagle3: the first release that does is 0.10.2"), std::string::npos)
      << r;
  EXPECT_NE(r.find("aux layers other than the default (2, N/2, N-3): the first release that does is 0.11.1"),
            std::string::npos)
      << r;
  write_export(dir + "/e", s.cfg, s.w, s.vocab, s.target, serving_target_from_string("vllm==0.11.1"));
  EngineRelease first;
  ASSERT_TRUE(first_serving_release(serving_needs(s.cfg, s.target, ServingEngine::Vllm), first));
  EXPECT_EQ(first, (EngineRelease{0, 11, 1}));
  // The default aux layers of an 8-layer target, (2, 4, 5): the format's 0.10.2; the speculators format 0.10.1.
  DraftConfig def = s.cfg;
  s.target.num_hidden_layers = 8;
  def.aux_layers = default_aux_layers(8);
  ASSERT_TRUE(first_serving_release(serving_needs(def, s.target, ServingEngine::Vllm), first));
  EXPECT_EQ(first, (EngineRelease{0, 10, 2}));
  ASSERT_TRUE(first_serving_release(serving_needs(def, s.target, ServingEngine::Vllm, "speculators"), first));
  EXPECT_EQ(first, (EngineRelease{0, 10, 1}));
  // Aux layer 0 (no residual yet at layer 0: 0.18.0); N (after the last layer: 0.18.0); a repeated layer is
  // captured once by every release of both engines.
  def.aux_layers = {0, 4, 8};
  ASSERT_TRUE(first_serving_release(serving_needs(def, s.target, ServingEngine::Vllm), first));
  EXPECT_EQ(first, (EngineRelease{0, 18, 0}));
  def.aux_layers = {2, 4, 4};
  EXPECT_FALSE(first_serving_release(serving_needs(def, s.target, ServingEngine::Vllm), first));
  EXPECT_FALSE(first_serving_release(serving_needs(def, s.target, ServingEngine::Sglang), first));
  def.aux_layers = {2, 4, 8};
  def.norm_before_residual = false;
  EXPECT_FALSE(first_serving_release(serving_needs(def, s.target, ServingEngine::Sglang), first));  // N: never
  // The softmax-router MoE targets: Qwen3-MoE from vLLM 0.11.1 / SGLang 0.4.9 (default aux layers of 8
  // layers: the format's 0.10.2 is below); Mixtral by no release of either.
  def.aux_layers = default_aux_layers(8);
  def.norm_before_residual = true;
  s.target.model_type = "qwen3_moe";
  ASSERT_TRUE(first_serving_release(serving_needs(def, s.target, ServingEngine::Vllm), first));
  EXPECT_EQ(first, (EngineRelease{0, 11, 1}));
  s.target.model_type = "mixtral";
  EXPECT_FALSE(first_serving_release(serving_needs(def, s.target, ServingEngine::Vllm), first));
  EXPECT_FALSE(first_serving_release(serving_needs(def, s.target, ServingEngine::Sglang), first));
  s.target.model_type = "llama";
  // A draft no vLLM release serves (a repeated aux layer): --for vllm refuses it in either format (--for any
  // warns).
  DraftConfig repeated = s.cfg;
  repeated.aux_layers = {2, 3, 3};
  SpeculatorsOptions so;
  so.verifier = "org/target";
  so.serving = ServingEngine::Vllm;
  const std::string no_vllm =
      testing::error_of([&] { write_speculators_export(dir + "/spec", repeated, s.w, s.vocab, s.target, so); });
  EXPECT_NE(no_vllm.find("no vLLM release aerie checked (up to 0.34.0) serves a repeated aux layer"), std::string::npos)
      << no_vllm;
  EXPECT_FALSE(fs::exists(dir + "/spec"));
  EXPECT_EQ(EngineRelease::parse("0.4.4.post2").str(), "0.4.4.post2");
  EXPECT_TRUE((EngineRelease::parse("0.4.4.post1") < EngineRelease::parse("0.4.4.post2")));
  EXPECT_FALSE(first_serving_release(serving_needs(s.cfg, s.target, ServingEngine::Sglang), first));
  s.cfg.norm_before_residual = false;
  ASSERT_TRUE(first_serving_release(serving_needs(s.cfg, s.target, ServingEngine::Sglang), first));
}

// An --output that holds anything but an export (a run folder given by mistake) is refused and left as
// it is; an earlier export is replaced (found by a new-user trial: the run folder was wiped).
// norm_before_residual: vLLM reads it, SGLang's Llama EAGLE-3 layer has no such option (its residual is
// always h): --for sglang refuses such a draft by name, --for vllm and --for any write it.
TEST(ExportTest, NormBeforeResidualIsRefusedForSglang) {
  const std::string dir = testing::scratch_dir("train_export_nbr_sglang");
  auto s = testing::make_tiny_setup(dir, {2, 3, 4});
  s.cfg.norm_before_residual = true;
  EXPECT_NE(testing::error_of([&] { write_export(dir + "/e_sglang", s.cfg, s.w, s.vocab, s.target, ServingEngine::Sglang); })
                .find("norm_before_residual"),
            std::string::npos);
  EXPECT_FALSE(fs::exists(dir + "/e_sglang"));
  write_export(dir + "/e_vllm", s.cfg, s.w, s.vocab, s.target, ServingEngine::Vllm);
  write_export(dir + "/e_any", s.cfg, s.w, s.vocab, s.target);
  EXPECT_EQ(nlohmann::json::parse(read_file(dir + "/e_any/config.json"))["norm_before_residual"], true);
  s.cfg.norm_before_residual = false;
  write_export(dir + "/e_plain", s.cfg, s.w, s.vocab, s.target, ServingEngine::Sglang);  // the plain draft: fine
}

// A draft trained with a sliding window: the eagle3 export carries it as vLLM's LlamaAttention reads it
// (config.layer_types[layer - target_layer_count] == "sliding_attention" takes config.sliding_window;
// vllm/model_executor/models/llama.py), load_export reads it back, the speculators export keeps both keys in
// transformer_layer_config (speculators' create_transformer_layer_config writes them there) and reads them
// back; SGLang's LlamaAttention has no window (srt/models/llama.py: RadixAttention without
// sliding_window_size): --for sglang refuses it, --for any warns.
TEST(ExportTest, SlidingWindowIsExportedAsVllmReadsIt) {
  const std::string dir = testing::scratch_dir("train_export_sliding_window");
  auto s = testing::make_tiny_setup(dir, {2, 3, 4});
  s.cfg.sliding_window = 2048;
  EXPECT_NE(testing::error_of([&] { write_export(dir + "/e_sglang", s.cfg, s.w, s.vocab, s.target, ServingEngine::Sglang); })
                .find("sliding window of 2048"),
            std::string::npos);
  EXPECT_FALSE(fs::exists(dir + "/e_sglang"));
  // With norm_before_residual too (train's default): one refusal names both, and how to train for SGLang.
  s.cfg.norm_before_residual = true;
  const std::string both =
      testing::error_of([&] { write_export(dir + "/e_sglang", s.cfg, s.w, s.vocab, s.target, ServingEngine::Sglang); });
  EXPECT_NE(both.find("sliding window of 2048"), std::string::npos) << both;
  EXPECT_NE(both.find("--draft-norm-before-residual=false"), std::string::npos) << both;
  EXPECT_NE(both.find("without --draft-sliding-window"), std::string::npos) << both;
  s.cfg.norm_before_residual = false;
  write_export(dir + "/e_any", s.cfg, s.w, s.vocab, s.target);
  write_export(dir + "/e", s.cfg, s.w, s.vocab, s.target, ServingEngine::Vllm);
  const nlohmann::json j = nlohmann::json::parse(read_file(dir + "/e/config.json"));
  EXPECT_EQ(j["layer_types"], nlohmann::json({"sliding_attention"}));
  EXPECT_EQ(j["sliding_window"], 2048);
  EXPECT_EQ(j["num_hidden_layers"], 1) << "layer_types lists num_hidden_layers kinds";
  EXPECT_EQ(load_export(dir + "/e").config.sliding_window, 2048);
  write_speculators_export(dir + "/spec", s.cfg, s.w, s.vocab, s.target, SpeculatorsOptions{"org/target", 3, {}});
  const nlohmann::json sj = nlohmann::json::parse(read_file(dir + "/spec/config.json"));
  EXPECT_EQ(sj["transformer_layer_config"]["layer_types"], nlohmann::json({"sliding_attention"}));
  EXPECT_EQ(sj["transformer_layer_config"]["sliding_window"], 2048);
  EXPECT_FALSE(sj.contains("layer_types")) << "a layer key, not a top-level one";
  EXPECT_EQ(load_export(dir + "/spec").config.sliding_window, 2048);
}

// A trained weight that the config does not switch on is refused by name when the export is read (eval's
// --draft): input_norm.weight of a norm_before_fc draft whose config lost the flag (vLLM's loader fails on
// it with a KeyError), and an fc_norm weight; another extra tensor (embed_tokens, which some exporters add)
// only warns.
TEST(ExportTest, ATrainedWeightTheConfigDoesNotSwitchOnIsRefused) {
  const std::string dir = testing::scratch_dir("train_export_stray_weight");
  auto s = testing::make_tiny_setup(dir, {2, 3, 4});
  testing::enable_norm_before_fc(s, 61);
  write_export(dir + "/e", s.cfg, s.w, s.vocab, s.target, ServingEngine::Vllm);
  EXPECT_TRUE(load_export(dir + "/e").config.norm_before_fc);
  nlohmann::json c = nlohmann::json::parse(read_file(dir + "/e/config.json"));
  c.erase("norm_before_fc");
  write_file_atomic(dir + "/e/config.json", c.dump());
  const std::string err = testing::error_of([&] { load_export(dir + "/e"); });
  EXPECT_NE(err.find("holds input_norm.weight"), std::string::npos) << err;
  EXPECT_NE(err.find("config.json"), std::string::npos) << err;

  // An extra tensor the draft does not read (embed_tokens.weight): read with a warning; fc_norm.0.weight: refused.
  auto p = testing::make_tiny_setup(dir, {2, 3, 4});
  write_export(dir + "/p", p.cfg, p.w, p.vocab, p.target, ServingEngine::Vllm);
  SafetensorsFile f = load_safetensors(dir + "/p/model.safetensors");
  f.tensors.emplace("embed_tokens.weight", Tensor::zeros({4, 4}, DType::BF16));
  save_safetensors(dir + "/p/model.safetensors", f);
  EXPECT_EQ(load_export(dir + "/p").config.norm_before_fc, false);
  f.tensors.emplace("fc_norm.0.weight", Tensor::zeros({4}, DType::BF16));
  save_safetensors(dir + "/p/model.safetensors", f);
  EXPECT_NE(testing::error_of([&] { load_export(dir + "/p"); }).find("fc_norm.0.weight"), std::string::npos);
}

// A target whose rope is not the one the draft was trained with (the export copies --model's rope): refused,
// naming both, and nothing written.
TEST(ExportTest, ATargetWithAnotherRopeIsRefused) {
  const std::string dir = testing::scratch_dir("train_export_other_rope");
  auto s = testing::make_tiny_setup(dir, {2, 3, 4});
  TargetConfig other = s.target;
  other.rope.theta *= 2;
  const std::string err =
      testing::error_of([&] { write_export(dir + "/e", s.cfg, s.w, s.vocab, other, ServingEngine::Vllm); });
  EXPECT_NE(err.find("the draft was trained with rope"), std::string::npos) << err;
  EXPECT_FALSE(fs::exists(dir + "/e"));
  write_export(dir + "/e", s.cfg, s.w, s.vocab, s.target, ServingEngine::Vllm);  // its own target: fine
}

TEST(ExportTest, RefusesToReplaceAFolderThatIsNotAnExport) {
  const std::string dir = testing::scratch_dir("train_export_replace");
  auto s = testing::make_tiny_setup(dir, {1, 3, 5});
  DraftWeights w = DraftWeights::zeros(s.cfg);
  fs::create_directories(dir + "/run/checkpoints");
  std::ofstream(dir + "/run/metrics.jsonl") << "{}\n";
  try {
    write_export(dir + "/run", s.cfg, w, s.vocab, s.target, ServingEngine::Vllm);
    FAIL() << "a run folder was replaced";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("which is not part of an export"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(fs::exists(dir + "/run/metrics.jsonl"));
  EXPECT_TRUE(fs::exists(dir + "/run/checkpoints"));
  write_export(dir + "/out", s.cfg, w, s.vocab, s.target, ServingEngine::Vllm);
  write_export(dir + "/out", s.cfg, w, s.vocab, s.target, ServingEngine::Vllm);  // an export is replaced
  EXPECT_TRUE(fs::exists(dir + "/out/model.safetensors"));
  EXPECT_FALSE(fs::exists(dir + "/out.old"));
}

// A transformers 5.x target config holds rope_theta and the scaling in one "rope_parameters" object: the
// export writes them in the 4.x spelling servers read (found with the Llama-3 family fixtures).
TEST(ExportTest, RopeParametersOfTransformers5AreExportedAsRopeScaling) {
  const std::string dir = testing::scratch_dir("train_export_rope_parameters");
  auto s = testing::make_tiny_setup(dir, default_aux_layers(6));
  nlohmann::json scaling = s.target.raw["rope_scaling"];
  ASSERT_TRUE(scaling.is_object());
  nlohmann::json rp = scaling;
  rp["rope_theta"] = 250000.0;
  s.target.raw.erase("rope_scaling");
  s.target.raw.erase("rope_theta");
  s.target.raw["rope_parameters"] = rp;
  nlohmann::json j = export_config(s.cfg, s.target);
  EXPECT_EQ(j["rope_theta"], 250000.0);
  EXPECT_EQ(j["rope_scaling"], scaling);
  s.target.raw["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 10000.0}};
  j = export_config(s.cfg, s.target);
  EXPECT_EQ(j["rope_theta"], 10000.0);
  EXPECT_TRUE(j["rope_scaling"].is_null());
}

TEST(ExportTest, TensorsAndLoadExportRoundTrip) {
  const std::string dir = testing::scratch_dir("train_export_tensors");
  auto s = testing::make_tiny_setup(dir, {1, 3, 5});
  const std::string out = dir + "/export";
  write_export(out, s.cfg, s.w, s.vocab, s.target);
  write_export(out, s.cfg, s.w, s.vocab, s.target);  // replaces the previous export
  EXPECT_FALSE(fs::exists(out + ".tmp"));
  EXPECT_FALSE(fs::exists(out + ".old"));
  nlohmann::json h = safetensors_header(out + "/model.safetensors");
  EXPECT_EQ(h["__metadata__"]["format"], "pt");
  EXPECT_EQ(h["__metadata__"]["aerie_version"], aerie_version_string());
  const DraftWeights shapes = DraftWeights::zeros(s.cfg);
  std::set<std::string> names;
  for (auto& [k, v] : h.items())
    if (k != "__metadata__") names.insert(k);
  std::set<std::string> want = {"d2t", "t2d"};
  for (auto& [n, t] : shapes.named()) {
    want.insert(n);
    EXPECT_EQ(h[n]["dtype"], "BF16") << n;
    EXPECT_EQ(h[n]["shape"].get<Shape>(), t->shape()) << n;
  }
  EXPECT_EQ(names, want);
  EXPECT_TRUE(names.count("midlayer.self_attn.q_proj.weight"));
  EXPECT_TRUE(names.count("midlayer.hidden_norm.weight"));
  for (const auto& n : names) EXPECT_EQ(n.find("embed_tokens"), std::string::npos) << n;
  EXPECT_EQ(h["d2t"]["dtype"], "I64");
  EXPECT_EQ(h["d2t"]["shape"], nlohmann::json::array({10}));
  EXPECT_EQ(h["t2d"]["dtype"], "BOOL");
  EXPECT_EQ(h["t2d"]["shape"], nlohmann::json::array({16}));
  EXPECT_EQ(h["fc.weight"]["shape"], nlohmann::json::array({8, 24}));  // [H, 3H]
  EXPECT_EQ(h["midlayer.self_attn.q_proj.weight"]["shape"], nlohmann::json::array({8, 16}));  // reads 2H

  ExportedDraft d = load_export(out, 6);
  EXPECT_EQ(d.vocab.d2t, s.vocab.d2t);
  EXPECT_EQ(d.vocab.t2d, s.vocab.t2d);
  EXPECT_EQ(d.config.aux_layers, (std::vector<int>{1, 3, 5}));
  EXPECT_EQ(d.config.max_position_embeddings, 131072);
  EXPECT_EQ(d.config.rope.type, "llama3");
  EXPECT_EQ(d.config.rope.factor, 8.0);
  EXPECT_EQ(d.config.rope.theta, 500000.0);
  EXPECT_EQ(d.config.draft_vocab_size, 10);
  auto got = d.weights.named();
  auto ref = s.w.named();
  for (size_t i = 0; i < got.size(); ++i) {
    std::vector<float> g = got[i].second->to_float_vector(), r = ref[i].second->to_float_vector();
    ASSERT_EQ(g.size(), r.size());
    int bad = 0;
    for (size_t k = 0; k < g.size(); ++k) bad += g[k] != round_bf16(r[k]);  // exactly the bf16 rounding
    EXPECT_EQ(bad, 0) << got[i].first;
  }

  // Default aux layers: named too, and read back with or without the target's depth; an export of an
  // older aerie (or another trainer) without any list gets the target's default.
  auto def = testing::make_tiny_setup(dir, default_aux_layers(6));
  write_export(out, def.cfg, def.w, def.vocab, def.target);
  EXPECT_EQ(load_export(out, 6).config.aux_layers, default_aux_layers(6));
  EXPECT_EQ(load_export(out).config.aux_layers, default_aux_layers(6));
  nlohmann::json bare = nlohmann::json::parse(read_file(out + "/config.json"));
  bare.erase("eagle_config");
  bare.erase("eagle_aux_hidden_state_layer_ids");
  write_file_atomic(out + "/config.json", bare.dump());
  EXPECT_EQ(load_export(out, 6).config.aux_layers, default_aux_layers(6));
  EXPECT_TRUE(load_export(out).config.aux_layers.empty());
}

// The MLA draft's export against vLLM's loader for it (vllm/model_executor/models/deepseek_eagle3.py,
// Eagle3DeepseekV2ForCausalLM): load_weights maps "midlayer." to "layers.0.", prefixes "model." to every
// name but lm_head, renames d2t to draft_id_to_target_id and skips t2d; DeepseekV2Eagle3DecoderLayer builds
// DeepseekV2MLAAttention with input_size 2 * hidden_size (q_a_proj [q_lora_rank, 2H], q_a_layernorm,
// q_b_proj [heads * (qk_nope + qk_rope), q_lora_rank], kv_a_proj_with_mqa [kv_lora_rank + qk_rope, 2H],
// kv_a_layernorm [kv_lora_rank], kv_b_proj [heads * (qk_nope + v_head_dim), kv_lora_rank], o_proj [H,
// heads * v_head_dim]; q_proj [heads * (qk_nope + qk_rope), 2H] without q_lora_rank), DeepseekV2MLP
// (gate/up [I, H], down [H, I]), input_layernorm, hidden_norm, post_attention_layernorm [H];
// DeepseekV2Eagle3Model adds fc [H, 3 * target_hidden_size] and norm [H]; lm_head [draft_vocab_size, H].
// Every tensor the export writes must be one of these names with this shape, and all of them present.
std::map<std::string, Shape> vllm_deepseek_eagle3_tensors(const nlohmann::json& c) {
  const int64_t H = c["hidden_size"], nh = c["num_attention_heads"], I = c["intermediate_size"],
                K = c["draft_vocab_size"], lora = c["kv_lora_rank"], nope = c["qk_nope_head_dim"],
                rope = c["qk_rope_head_dim"], vd = c["v_head_dim"];
  const int64_t Ht = c.contains("target_hidden_size") ? c["target_hidden_size"].get<int64_t>() : H;
  const std::string a = "midlayer.self_attn.";
  std::map<std::string, Shape> t = {{"fc.weight", {H, 3 * Ht}},
                                    {a + "kv_a_proj_with_mqa.weight", {lora + rope, 2 * H}},
                                    {a + "kv_a_layernorm.weight", {lora}},
                                    {a + "kv_b_proj.weight", {nh * (nope + vd), lora}},
                                    {a + "o_proj.weight", {H, nh * vd}},
                                    {"midlayer.mlp.gate_proj.weight", {I, H}},
                                    {"midlayer.mlp.up_proj.weight", {I, H}},
                                    {"midlayer.mlp.down_proj.weight", {H, I}},
                                    {"midlayer.input_layernorm.weight", {H}},
                                    {"midlayer.hidden_norm.weight", {H}},
                                    {"midlayer.post_attention_layernorm.weight", {H}},
                                    {"norm.weight", {H}},
                                    {"lm_head.weight", {K, H}},
                                    {"d2t", {K}},
                                    {"t2d", {c["vocab_size"].get<int64_t>()}}};
  if (c["q_lora_rank"].is_null()) {
    t[a + "q_proj.weight"] = {nh * (nope + rope), 2 * H};
  } else {
    const int64_t ql = c["q_lora_rank"];
    t[a + "q_a_proj.weight"] = {ql, 2 * H};
    t[a + "q_a_layernorm.weight"] = {ql};
    t[a + "q_b_proj.weight"] = {nh * (nope + rope), ql};
  }
  return t;
}

TEST(ExportTest, MlaDraftHasTheNamesAndShapesOfVllmsLoader) {
  const std::string dir = testing::scratch_dir("train_export_mla");
  TargetConfig target =
      load_target_config(std::string(AERIE_SOURCE_DIR) + "/tests/model/fixtures/hf/deepseek_v3");
  // As a 5-layer target: the fixture's 3 layers leave no three distinct aux layers other than the embedding
  // output (vLLM's DeepSeek capture has no residual there) and the last layer's (SGLang captures before a layer
  // only).
  target.num_hidden_layers = 5;
  ASSERT_TRUE(target.mla.enabled());
  std::vector<int64_t> selected;
  DraftVocab vocab;
  vocab.t2d.assign(static_cast<size_t>(target.vocab_size), 0);
  for (int64_t i = 0; i < 40; ++i) selected.push_back(i * 6);
  for (size_t i = 0; i < selected.size(); ++i) {
    vocab.d2t.push_back(selected[i] - static_cast<int64_t>(i));
    vocab.t2d[static_cast<size_t>(selected[i])] = 1;
  }
  const DraftConfig cfg = DraftConfig::from_target(target, 40, {1, 2, 3}, true);
  ASSERT_TRUE(cfg.is_mla());
  Tensor lm = Tensor::zeros({target.vocab_size, target.hidden_size}, DType::F32);
  const DraftWeights w = init_draft_weights(cfg, lm, selected, 5, true);
  const std::string out = dir + "/export";
  // SGLang's MLA draft (sglang==0.5.12 to 0.5.23 sglang/srt/models/kimi_k25_eagle3.py):
  // its midlayer keeps `residual = hidden_states` (h) before hidden_norm, so a draft trained with
  // norm_before_residual is refused --for sglang; its load_weights takes vLLM's names (q_a_proj and
  // kv_a_proj_with_mqa cached and concatenated into fused_qkv_a_proj_with_mqa, gate/up into gate_up_proj,
  // "model." prefixed, d2t read, t2d skipped). Every release with it (sglang 0.5.12 to 0.5.23,
  // srt/models/kimi_k25_eagle3.py) registers it as Eagle3DeepseekV2ForCausalLM, vLLM's name, only.
  DraftConfig nbr = cfg;
  nbr.norm_before_residual = true;
  const std::string refused =
      testing::error_of([&] { write_export(out, nbr, w, vocab, target, ServingEngine::Sglang); });
  EXPECT_NE(refused.find("norm_before_residual"), std::string::npos) << refused;
  EXPECT_NE(refused.find("export --for SGLang 0.5.23"), std::string::npos) << refused;
  EXPECT_FALSE(fs::exists(out));
  write_export(dir + "/export_sglang", cfg, w, vocab, target, ServingEngine::Sglang);
  const nlohmann::json cs = nlohmann::json::parse(read_file(dir + "/export_sglang/config.json"));
  EXPECT_EQ(cs["architectures"], nlohmann::json::array({"Eagle3DeepseekV2ForCausalLM"}));
  // SGLang 0.5.13 on: a DeepSeek target's list whose first id is 1 gets + 1, so 1 goes second (captured in
  // layer order); vLLM's list as trained.
  EXPECT_EQ(cs["eagle_config"]["eagle_aux_hidden_state_layer_ids"], nlohmann::json::array({2, 1, 3}));
  EXPECT_EQ(cs["eagle_aux_hidden_state_layer_ids"], nlohmann::json::array({1, 2, 3}));
  // sglang 0.5.11 has no MLA draft; vLLM 0.16 serves no deepseek_v3 target with EAGLE-3.
  ServingTarget sglang_0511 = serving_target_from_string("sglang==0.5.11");
  const std::string old_sglang = testing::error_of([&] { write_export(out, cfg, w, vocab, target, sglang_0511); });
  EXPECT_NE(old_sglang.find("the first release that does is 0.5.12"), std::string::npos) << old_sglang;
  const std::string old_vllm =
      testing::error_of([&] { write_export(out, cfg, w, vocab, target, serving_target_from_string("vllm==0.16.0")); });
  EXPECT_NE(old_vllm.find("EAGLE-3 for a deepseek_v3 target: the first release that does is 0.18.0"), std::string::npos)
      << old_vllm;
  EXPECT_NE(old_vllm.find("the MLA draft (Eagle3DeepseekV2ForCausalLM): the first release that does is 0.18.0"),
            std::string::npos)
      << old_vllm;
  EXPECT_FALSE(fs::exists(out));
  std::map<std::string, Shape> got_sglang;
  const nlohmann::json hs = safetensors_header(dir + "/export_sglang/model.safetensors");
  for (auto& [k, v] : hs.items())
    if (k != "__metadata__") got_sglang[k] = v["shape"].get<Shape>();
  EXPECT_EQ(got_sglang, vllm_deepseek_eagle3_tensors(cs));
  EXPECT_EQ(load_export(dir + "/export_sglang", target.num_hidden_layers).config.is_mla(), true);
  write_export(out, cfg, w, vocab, target, ServingEngine::Vllm);
  const nlohmann::json c = nlohmann::json::parse(read_file(out + "/config.json"));
  EXPECT_EQ(c["architectures"], nlohmann::json::array({"Eagle3DeepseekV2ForCausalLM"}));
  EXPECT_EQ(c["num_hidden_layers"], 1);
  EXPECT_EQ(c["rope_scaling"], target.raw["rope_scaling"]);  // vLLM turns it into deepseek_yarn
  EXPECT_EQ(c["eagle_config"]["eagle_aux_hidden_state_layer_ids"], nlohmann::json::array({2, 1, 3}));
  EXPECT_EQ(load_export(out, target.num_hidden_layers).config.aux_layers, (std::vector<int>{1, 2, 3}));
  const nlohmann::json h = safetensors_header(out + "/model.safetensors");
  std::map<std::string, Shape> got;
  for (auto& [k, v] : h.items())
    if (k != "__metadata__") got[k] = v["shape"].get<Shape>();
  EXPECT_EQ(got, vllm_deepseek_eagle3_tensors(c));
  // load_export reads it back as the MLA draft (eval's path), the weights rounded to bf16 once.
  ExportedDraft d = load_export(out, target.num_hidden_layers);
  EXPECT_TRUE(d.config.is_mla());
  EXPECT_EQ(d.config.q_lora_rank, target.mla.q_lora_rank);
  auto a = d.weights.named();
  auto b = w.named();
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].first, b[i].first);
    const std::vector<float> x = a[i].second->to_float_vector(), y = b[i].second->to_float_vector();
    for (size_t k = 0; k < x.size(); ++k) ASSERT_EQ(x[k], round_bf16(y[k])) << a[i].first;
  }
}

// Kimi-K2.5's real config: the MLA draft's config carries the fields of TorchSpec's published MLA draft
// config (configs/draft_models/kimi_k25_eagle3_mla.json) that vLLM's loader reads, with their values. Not
// compared: model_type (TorchSpec's "kimi_k2" needs the model's remote code; aerie writes transformers'
// own "deepseek_v2", whose config class has every MLA field; vLLM serves a "deepseek_v3" draft as DeepSeek's MTP
// module), rope_scaling (copied from the target; TorchSpec's
// training-init file changed beta_fast), eagle_config (other aux layers), draft_vocab_size (TorchSpec keeps
// the full 163840).
TEST(ExportTest, MlaDraftConfigForKimiK25MatchesTorchSpecs) {
  const std::string cfgs = testing::data_dir() + "/kimi-deepseek-configs";
  if (!fs::exists(cfgs + "/eagle3-torchspec/kimi_k25_eagle3_mla.json")) GTEST_SKIP() << "no " << cfgs;
  const std::string dir = testing::scratch_dir("train_export_mla_kimi");
  fs::copy_file(cfgs + "/config-kimi-k25/config.transformers-5.7.0-redump.json", dir + "/config.json");
  const TargetConfig target = load_target_config(dir);
  const nlohmann::json ts = nlohmann::json::parse(read_file(cfgs + "/eagle3-torchspec/kimi_k25_eagle3_mla.json"));
  DraftConfig cfg = DraftConfig::from_target(target, ts["draft_vocab_size"].get<int64_t>(),
                                             default_aux_layers(target.num_hidden_layers), true);
  const nlohmann::json c = export_config(cfg, target);
  for (const char* k : {"architectures", "hidden_size", "intermediate_size", "num_hidden_layers",
                        "num_attention_heads", "num_key_value_heads", "q_lora_rank", "kv_lora_rank",
                        "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "hidden_act", "rms_norm_eps",
                        "vocab_size", "draft_vocab_size", "torch_dtype", "rope_theta"})
    EXPECT_EQ(c[k], ts[k]) << k;
  EXPECT_EQ(c["model_type"], "deepseek_v2");
  EXPECT_EQ(c["n_routed_experts"], 0);
  EXPECT_EQ(c["rope_scaling"]["type"], ts["rope_scaling"]["type"]);
  EXPECT_EQ(c["rope_scaling"]["factor"], ts["rope_scaling"]["factor"]);
}

// A draft vocabulary of all V target ids: no d2t in the export (vLLM 0.30 on refuses one then), and load_export
// reads the identity back; without d2t a smaller vocabulary is refused.
TEST(ExportTest, FullDraftVocabularyHasNoD2t) {
  const std::string dir = testing::scratch_dir("train_export_full_vocab");
  auto s = testing::make_tiny_setup(dir);
  std::vector<int64_t> all(16);
  for (int64_t i = 0; i < 16; ++i) all[static_cast<size_t>(i)] = i;
  s.vocab.d2t.assign(16, 0);
  s.vocab.t2d.assign(16, 1);
  s.cfg = DraftConfig::from_target(s.target, 16, {2, 3, 3});
  s.w = init_draft_weights(s.cfg, s.lm_head, all, 5);
  const std::string out = dir + "/export";
  write_export(out, s.cfg, s.w, s.vocab, s.target);
  nlohmann::json h = safetensors_header(out + "/model.safetensors");
  EXPECT_FALSE(h.contains("d2t"));
  EXPECT_EQ(h["t2d"]["shape"], nlohmann::json::array({16}));
  ExportedDraft d = load_export(out, 6);
  EXPECT_EQ(d.vocab.d2t, std::vector<int64_t>(16, 0));
  EXPECT_EQ(d.vocab.t2d, std::vector<uint8_t>(16, 1));

  auto small = testing::make_tiny_setup(testing::scratch_dir("train_export_full_vocab_small"));
  write_export(out, small.cfg, small.w, small.vocab, small.target);
  SafetensorsFile f = load_safetensors(out + "/model.safetensors");
  f.tensors.erase("d2t");
  save_safetensors(out + "/model.safetensors", f, {"t2d"});
  try {
    load_export(out, 6);
    ADD_FAILURE() << "an export of 10 of 16 ids without d2t was read";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("d2t missing"), std::string::npos) << e.what();
  }
}

TEST(ExportTest, LoadExportRejectsInconsistentVocab) {
  const std::string dir = testing::scratch_dir("train_export_bad");
  auto s = testing::make_tiny_setup(dir);
  const std::string out = dir + "/export";
  write_export(out, s.cfg, s.w, s.vocab, s.target);
  SafetensorsFile f = load_safetensors(out + "/model.safetensors");
  f.tensors["t2d"].data<uint8_t>()[3] = 1;  // id 3 is not in d2t
  save_safetensors(out + "/model.safetensors", f, {"t2d"});
  EXPECT_THROW(load_export(out), Error);
  f.tensors.erase("t2d");
  save_safetensors(out + "/model.safetensors", f);
  EXPECT_THROW(load_export(out), Error);
}

// The MLA draft as vLLM 0.26.0 reads and computes it: tests/train/fixtures/vllm_mla_draft is an `export --for vllm`
// of a `train --draft-attention mla` run on the deepseek_v3 fixture (YaRN factor 40 past its 64 original positions),
// its tensors redrawn, with the step-0 logits that tools/reference/vllm_mla_draft_golden.py computes from vLLM's
// released code (deepseek_eagle3.py, DeepseekV2MLAAttention, the deepseek_yarn rope) in float64. aerie's draft
// loaded from the same directory gives the same logits: the config keys and tensors mean to aerie what they mean to
// the engine. Row t: token ids[t] and aux hidden states aux[t] at position t (aerie's step-0 row t reads x_{t+1}).
TEST(ExportTest, MlaDraftComputesWhatVllmsLayerComputes) {
  const std::string src = std::string(AERIE_SOURCE_DIR), dir = src + "/tests/train/fixtures/vllm_mla_draft";
  const std::string target_dir = src + "/tests/model/fixtures/hf/deepseek_v3";
  const TargetConfig target = load_target_config(target_dir);
  ExportedDraft d = load_export(dir, target.num_hidden_layers);
  ASSERT_TRUE(d.config.is_mla());
  SafetensorsFile g = load_safetensors(dir + "/golden.safetensors");
  const Tensor& ids = g.tensors.at("ids");
  const Tensor& aux = g.tensors.at("aux");
  const Tensor& want = g.tensors.at("logits");
  const int64_t T = ids.numel(), A = aux.dim(1), K = want.dim(1);
  ASSERT_EQ(K, d.vocab.draft_vocab_size());
  TTTSample s;
  s.ids.push_back(0);  // x_0: step-0 row t reads x_{t+1}
  for (int64_t t = 0; t < T; ++t) s.ids.push_back(ids.data<int32_t>()[t]);
  s.loss_mask.assign(static_cast<size_t>(T + 1), 1);
  s.aux_hidden = Tensor::zeros({T + 1, A}, DType::F32);
  std::memcpy(s.aux_hidden.data<float>(), aux.data<float>(), sizeof(float) * static_cast<size_t>(T * A));
  s.target_probs = Tensor::from_vector(std::vector<float>(static_cast<size_t>((T + 1) * K), 1.0f / static_cast<float>(K)),
                                       {T + 1, K});
  s.target_argmax.assign(static_cast<size_t>(T + 1), d.vocab.selected()[0]);
  const Tensor embed = load_target_head(target_dir, target).embed_tokens;
  std::vector<Tensor> logits;
  ttt_forward_backward(d.config, d.weights, embed, s, d.vocab.d2t, d.vocab.t2d, 1, {1.0}, nullptr, &logits);
  ASSERT_EQ(logits[0].shape(), want.shape());
  double worst = 0, mag = 0;
  for (int64_t i = 0; i < want.numel(); ++i) {
    worst = std::max(worst, std::fabs(static_cast<double>(logits[0].data<float>()[i]) - want.data<float>()[i]));
    mag = std::max(mag, std::fabs(static_cast<double>(want.data<float>()[i])));
  }
  EXPECT_GT(mag, 0.5);  // logits of some size: a draft that outputs ~0 everywhere would pass a loose bound
  EXPECT_LT(worst, 2e-4 * (1 + mag)) << "largest logit " << mag;
}

// An MLA draft without a query LoRA (a target such as DeepSeek-V2-Lite, q_proj): no engine release loads it (vLLM
// stacks kv_a_proj_with_mqa into fused_qkv_a_proj, built only with q_lora_rank; SGLang raises), so no release is
// named as serving it; with the query LoRA vLLM 0.18.0 and SGLang 0.5.12 are.
TEST(ExportTest, MlaDraftWithoutQueryLoraHasNoServingRelease) {
  TargetConfig ds = load_target_config(std::string(AERIE_SOURCE_DIR) + "/tests/model/fixtures/hf/deepseek_v3");
  ds.num_hidden_layers = 8;  // aux layers both engines capture: inputs of layers 2, 4 and 5
  ds.moe.layers.resize(8, true);
  DraftConfig cfg = DraftConfig::from_target(ds, 64, {2, 4, 5}, true);
  ASSERT_GT(cfg.q_lora_rank, 0);
  EngineRelease first;
  const std::vector<ServingNeed> needs = serving_needs(cfg, ds, ServingEngine::Vllm);
  ASSERT_TRUE(first_serving_release(needs, first));
  EXPECT_EQ(first, (EngineRelease{0, 18, 0}));
  for (const ServingNeed& n : needs)  // the MLA draft's architecture, not the Llama draft's
    EXPECT_EQ(n.what.find("LlamaForCausalLMEagle3"), std::string::npos) << n.what;
  cfg.norm_before_residual = false;  // SGLang reads no norm_before_residual
  ASSERT_TRUE(first_serving_release(serving_needs(cfg, ds, ServingEngine::Sglang), first));
  EXPECT_EQ(first, (EngineRelease{0, 5, 12}));
  cfg.q_lora_rank = 0;
  EXPECT_FALSE(first_serving_release(serving_needs(cfg, ds, ServingEngine::Vllm), first));
  EXPECT_FALSE(first_serving_release(serving_needs(cfg, ds, ServingEngine::Sglang), first));
  // So train gives the draft of such a target a query LoRA of its own (kv_lora_rank wide).
  TargetConfig lite = ds;
  lite.mla.q_lora_rank = 0;
  EXPECT_EQ(DraftConfig::from_target(lite, 64, {2, 4, 5}, true).q_lora_rank, lite.mla.kv_lora_rank);
}

}  // namespace
}  // namespace aerie
