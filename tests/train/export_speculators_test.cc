// `aerie export --format speculators`: the config keys and the tensor names, shapes and
// dtypes are lists written here from the loaders' source, the values are the default export's.
//
// Sources read (the commit is the stored version that was read):
//  vllm-project/speculators @ c05b95b303f7d4f21e8d7624e0ffa1c2d9b4d73b (2026-08-20)
//   [S1] src/speculators/models/eagle3/config.py: Eagle3SpeculatorConfig, registered as "eagle3":
//        speculators_model_type "eagle3", architectures ["Eagle3Speculator"], transformer_layer_config (a
//        dict whose model_type picks the transformers config class), draft_vocab_size,
//        norm_before_residual, target_hidden_size (None: equal to hidden_size),
//        eagle_aux_hidden_state_layer_ids, norm_before_fc, fc_norm, norm_output; target_vocab_size is
//        transformer_layer_config.vocab_size.
//   [S2] src/speculators/config.py: SpeculatorsConfig {algorithm, proposal_methods, default_proposal_method
//        (must be one of the methods' proposal_type), verifier}; VerifierConfig {name_or_path,
//        architectures}; SpeculatorModelConfig.to_dict drops model_type (no top-level model_type).
//   [S3] src/speculators/proposals/greedy.py: GreedyTokenProposalConfig {proposal_type "greedy",
//        speculative_tokens, verifier_accept_k, accept_tolerance}.
//   [S4] src/speculators/convert/eagle/eagle3_converter.py: an EAGLE-3 checkpoint (the default export's
//        layout) becomes speculators by renaming "midlayer." to "layers.0." (other names kept), a LlamaConfig
//        transformer_layer_config (vocab_size = the target's V, num_hidden_layers 1, rope, max positions,
//        tie_word_embeddings false), greedy with speculative_tokens 3, verifier {name_or_path: base model,
//        architectures: its config.json's}.
//   [S5] src/speculators/convert/eagle/eagle3_legacy_model.py: Eagle3Speculator's tensors: fc [H, 3 Ht],
//        layers.0.self_attn.{q,k,v}_proj [*, 2H], o_proj, layers.0.mlp.*, layers.0.{input_layernorm,
//        hidden_norm, post_attention_layernorm}, norm, lm_head [K, H], buffers d2t long [K], t2d bool [V];
//        embed_tokens only when the checkpoint has one.
//   [S6] src/speculators/models/eagle3/core.py: Eagle3DraftModel ignores a missing embed_tokens.weight,
//        d2t and t2d on load.
//  vllm-project/vllm
//   [V1] vllm/transformers_utils/config.py @ 0036026e7171bd02e3c1d4687b102dec9c446049: HFConfigParser takes
//        model_type "speculators" only when config.json has no model_type and has speculators_config;
//        maybe_override_with_speculators (what `vllm serve DRAFT_DIR` runs) serves
//        speculators_config.verifier.name_or_path as the model, the draft dir as the speculative model.
//   [V2] vllm/transformers_utils/configs/speculators/base.py @ 052316aeab2a1b2a9076518f20fe776052b947c9:
//        validate_speculators_config needs speculators_config.proposal_methods[0].speculative_tokens,
//        speculators_config.verifier.name_or_path, speculators_model_type and a transformer_layer_config
//        dict; the draft's config is transformer_layer_config updated by the algorithm's function;
//        method = speculators_model_type, num_speculative_tokens = speculative_tokens.
//   [V3] vllm/transformers_utils/configs/speculators/algos.py @ cfb173ab8e1b8e44dd35f8b5188255b6a03e13ec:
//        update_eagle3 copies draft_vocab_size, target_hidden_size (when not None), norm_before_residual
//        (default True when absent), eagle_aux_hidden_state_layer_ids (top level) and sets architectures
//        ["Eagle3LlamaForCausalLM"]; later versions of the file (in the index without a pinned commit)
//        also read norm_before_fc, fc_norm, norm_output (default False) and choose the architecture from
//        transformer_layer_config.model_type ("llama" -> Eagle3LlamaForCausalLM).
//   [V4] vllm/model_executor/models/llama_eagle3.py @ 00bd1493b3e82d6c13c68ee8a0e1c5a96707e190:
//        load_weights renames midlayer. -> layers.0., d2t -> draft_id_to_target_id (long [K]), skips t2d,
//        loads embed_tokens only when present, q/k/v and gate/up into fused weights; the first layer's
//        qkv reads 2 H, fc reads 3 target_hidden_size; norm_before_residual false keeps the un-normed
//        hidden state as the residual (aerie's layer, src/model/draft_layer.cc), true takes
//        hidden_norm(h) as the residual (_norm_before_residual: --draft-norm-before-residual).
//   [V5] vllm/v1/worker/gpu_model_runner.py (_get_eagle3_aux_layers_from_config, read in index copies
//        without a pinned commit): the target captures hf_config.eagle_aux_hidden_state_layer_ids, else
//        eagle_config's, else its default.
//  norm_output (EAGLE-3.1), read 2026-12-02 in the vllm 0.33.0 and sglang 0.5.23 wheels and speculators @ c05b95b3:
//   [V6] vllm/model_executor/models/llama_eagle3.py LlamaModel.forward: hidden_states, hidden_prenorm =
//        self.norm(hidden_states, residual); aux_output = hidden_states if self.norm_output else
//        hidden_prenorm (the hidden handed to the next draft step, v1/spec_decode/llm_base_proposer.py);
//        norm_output = getattr(config, "norm_output", False); algos.py update_eagle3 copies the top-level
//        norm_output (default False).
//   [G1] sglang python/sglang/srt/models/llama_eagle3.py LlamaModel.forward: aux = hidden_states_to_logits
//        if self.norm_output else hidden_states_to_aux (top-level config.norm_output, default False).
//   [S7] speculators src/speculators/models/eagle3/core.py Eagle3DraftModel.forward: with
//        config.norm_output the next TTT step reads norm(hidden_states), the lm_head's input; no new weight.
//  norm_before_fc (EAGLE-3.1), read 2026-12-02 in the vllm 0.33.0, sglang 0.5.23 and speculators 0.9.0 wheels:
//   [V7] vllm/model_executor/models/llama_eagle3.py LlamaModel.__init__: norm_before_fc =
//        bool(eagle_config.get("norm_before_fc", getattr(config, "norm_before_fc", False))) (eagle_config
//        first, then the top level); self.input_norm = RMSNorm(fc_input_size = target_hidden_size * 3,
//        eps=config.rms_norm_eps); Eagle3LlamaForCausalLM.combine_hidden_states: hidden_states =
//        input_norm(hidden_states) before self.model.fc; load_weights prefixes "model." to every name but
//        lm_head (so "input_norm.weight" -> model.input_norm.weight) and drops "input_norm." weights when
//        the option is off.
//   [V8] vllm/transformers_utils/configs/speculators/algos.py update_eagle3: norm_before_fc =
//        config_dict.get("norm_before_fc", False) (top level), fc_norm likewise.
//   [G2] sglang python/sglang/srt/models/llama_eagle3.py LlamaModel.__init__: the same reading as [V7],
//        input_norm = RMSNorm(hidden_size_in * num_aux_hidden_states, eps=config.rms_norm_eps), applied to
//        the 3 H_t-wide aux states before fc in forward; LlamaForCausalLMEagle3.load_weights maps a name
//        missing from the parameters to "model." + name (input_norm.weight -> model.input_norm.weight).
//   [S8] speculators src/speculators/models/eagle3/core.py Eagle3DraftModel.__init__ / forward: input_norm =
//        norm_class(num_aux * hidden_size, eps) under config.norm_before_fc, applied before fc;
//        "input_norm.weight" at the top level (in _keys_to_ignore_on_load_missing); config.py: norm_before_fc
//        (default False) and fc_norm (per-chunk norms fc_norm.{0,1,2}) are mutually exclusive.
//  fc_norm (EAGLE-3.1's per-chunk norms), read 2026-12-03 in the vllm 0.33.0 wheel:
//   [V9] vllm/model_executor/models/llama_eagle3.py LlamaModel.__init__: with getattr(config, "fc_norm",
//        False) (the top-level key only), self.fc_norm = nn.ModuleList of num_aux_hidden_states RMSNorm(
//        target_hidden_size, eps=config.rms_norm_eps); Eagle3LlamaForCausalLM.combine_hidden_states: after
//        the input_norm of [V7] (when on), hidden_states.chunk(num_aux_hidden_states) each through its norm,
//        concatenated, then fc; load_weights prefixes "model." (fc_norm.0.weight -> model.fc_norm.0.weight)
//        and has no rule that drops fc_norm weights (with the option off, AutoWeightsLoader finds no such
//        parameter).
#include <cstring>
#include <filesystem>
#include <map>
#include <random>
#include <set>

#include "core/error.h"
#include "core/version.h"
#include "io/safetensors.h"
#include "train/checkpoint.h"
#include "train/export.h"
#include "train/train_testing.h"

namespace aerie {
namespace {

namespace fs = std::filesystem;

// A safetensors file as written: the JSON header and the data bytes (to compare dtypes and raw values).
struct RawSafetensors {
  nlohmann::json header;
  std::string data;
  std::string bytes_of(const std::string& name) const {
    const auto& o = header.at(name).at("data_offsets");
    return data.substr(o[0].get<size_t>(), o[1].get<size_t>() - o[0].get<size_t>());
  }
};
RawSafetensors read_raw(const std::string& path) {
  std::string bytes = read_file(path);
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  return {nlohmann::json::parse(bytes.substr(8, n)), bytes.substr(8 + n)};
}
std::set<std::string> keys_of(const nlohmann::json& j) {
  std::set<std::string> k;
  for (auto& [key, v] : j.items()) k.insert(key);
  return k;
}

// The top-level keys: [S1] Eagle3SpeculatorConfig's fields that vLLM [V2, V3] reads, speculators_config
// [S2], tie_word_embeddings and torch_dtype (PretrainedConfig's, as the converter's config carries them),
// aerie_version (who wrote it; speculators keeps extra keys, vLLM ignores them), eagle_config (the aux ids
// where SGLang and EAGLE-3 configs keep them, as in the default format; vLLM 0.26.0 served such an export:
// docs/performance.md). No model_type [S2, V1].
const std::set<std::string> kTopKeys = {"speculators_model_type", "architectures", "transformer_layer_config",
                                        "draft_vocab_size", "target_hidden_size", "norm_before_residual",
                                        "norm_before_fc", "fc_norm", "norm_output",
                                        "eagle_aux_hidden_state_layer_ids", "eagle_config", "speculators_config",
                                        "tie_word_embeddings", "torch_dtype", "aerie_version"};
// transformer_layer_config: the LlamaConfig keys of [S4] that the draft layer [V4] reads.
const std::set<std::string> kLayerKeys = {"model_type", "hidden_size", "num_attention_heads",
                                          "num_key_value_heads", "head_dim", "intermediate_size",
                                          "num_hidden_layers", "rms_norm_eps", "vocab_size",
                                          "max_position_embeddings", "rope_theta", "rope_scaling",
                                          "tie_word_embeddings", "torch_dtype", "hidden_act"};

TEST(ExportSpeculatorsTest, ConfigHasTheFieldsTheLoadersRead) {
  const std::string dir = testing::scratch_dir("train_export_speculators_config");
  auto s = testing::make_tiny_setup(dir, {1, 3, 5});
  SpeculatorsOptions o;
  o.verifier = "meta-llama/Llama-3.1-8B-Instruct";
  o.speculative_tokens = 4;
  const nlohmann::json j = speculators_export_config(s.cfg, s.target, o);
  EXPECT_EQ(keys_of(j), kTopKeys);
  EXPECT_EQ(j["speculators_model_type"], "eagle3");
  EXPECT_EQ(j["architectures"], nlohmann::json::array({"Eagle3Speculator"}));
  EXPECT_EQ(j["draft_vocab_size"], 10);
  EXPECT_TRUE(j["target_hidden_size"].is_null());  // equal to hidden_size [S1]
  EXPECT_EQ(j["norm_before_residual"], false);     // vLLM's default without the key is true [V3]
  EXPECT_EQ(j["norm_before_fc"], false);
  EXPECT_EQ(j["fc_norm"], false);
  EXPECT_EQ(j["norm_output"], false);
  EXPECT_EQ(j["eagle_aux_hidden_state_layer_ids"], nlohmann::json::array({1, 3, 5}));  // top level [V3, V5]
  EXPECT_EQ(j["tie_word_embeddings"], false);
  EXPECT_EQ(j["aerie_version"], aerie_version_string());
  const nlohmann::json want_spec = {
      {"algorithm", "eagle3"},
      {"proposal_methods",
       {{{"proposal_type", "greedy"}, {"speculative_tokens", 4}, {"verifier_accept_k", 1}, {"accept_tolerance", 0.0}}}},
      {"default_proposal_method", "greedy"},
      {"verifier", {{"name_or_path", "meta-llama/Llama-3.1-8B-Instruct"}, {"architectures", {"LlamaForCausalLM"}}}}};
  EXPECT_EQ(j["speculators_config"], want_spec);  // [S2, S3, V2]

  // The layer config: the default export's values for these keys (rope and positions from the target).
  const nlohmann::json& l = j["transformer_layer_config"];
  EXPECT_EQ(keys_of(l), kLayerKeys);
  const nlohmann::json eagle3 = export_config(s.cfg, s.target);
  for (const auto& k : kLayerKeys) EXPECT_EQ(l[k], eagle3[k]) << k;
  EXPECT_EQ(l["model_type"], "llama");  // -> Eagle3LlamaForCausalLM [V3]
  EXPECT_EQ(l["num_hidden_layers"], 1);
  EXPECT_EQ(l["vocab_size"], 16);  // the target's V [S1, S4]
  EXPECT_EQ(l["max_position_embeddings"], 131072);
  EXPECT_EQ(l["rope_scaling"]["rope_type"], "llama3");

  // Another draft width: target_hidden_size is written [V3, V4: fc reads 3 target_hidden_size].
  DraftConfig wide = s.cfg;
  wide.hidden_size = 16;
  EXPECT_EQ(speculators_export_config(wide, s.target, o)["target_hidden_size"], 8);
  // No verifier, or no draft tokens: refused.
  o.verifier = "";
  EXPECT_NE(testing::error_of([&] { speculators_export_config(s.cfg, s.target, o); }).find("verifier"),
            std::string::npos);
  o.verifier = "x";
  o.speculative_tokens = 0;
  EXPECT_THROW(speculators_export_config(s.cfg, s.target, o), Error);
  // The same checks as the default export: a draft of another target is refused.
  DraftConfig bad = s.cfg;
  bad.vocab_size = 32;
  o.speculative_tokens = 3;
  EXPECT_THROW(speculators_export_config(bad, s.target, o), Error);
}

TEST(ExportSpeculatorsTest, FormatNamesAndTensorNames) {
  EXPECT_EQ(export_format_from_string("eagle3"), ExportFormat::Eagle3);
  EXPECT_EQ(export_format_from_string("speculators"), ExportFormat::Speculators);
  EXPECT_NE(testing::error_of([] { export_format_from_string("gguf"); }).find("--format gguf: want eagle3 or speculators"),
            std::string::npos);
  // [S4] / [V4]: midlayer. -> layers.0., the rest as they are.
  EXPECT_EQ(speculators_tensor_name("midlayer.self_attn.q_proj.weight"), "layers.0.self_attn.q_proj.weight");
  EXPECT_EQ(speculators_tensor_name("midlayer.hidden_norm.weight"), "layers.0.hidden_norm.weight");
  EXPECT_EQ(speculators_tensor_name("fc.weight"), "fc.weight");
  EXPECT_EQ(speculators_tensor_name("norm.weight"), "norm.weight");
  EXPECT_EQ(speculators_tensor_name("d2t"), "d2t");
}

// The demo model (stories260K: H 64, 8 heads of 8, 4 kv heads, I 172, V 512, 5 layers) with K = 128 and aux
// layers (2, 3, 4), as the demo trains it: the speculators export's tensors are this list (names [S5, V4],
// shapes [S5, V4], dtypes [S5]: long d2t, bool t2d; BF16 weights as the default export), their bytes are
// the default export's, and load_export reads both exports alike.
TEST(ExportSpeculatorsTest, DemoModelExportIsTheListAndTheDefaultExportsValues) {
  AERIE_REQUIRE_MODEL();
  const std::string dir = testing::scratch_dir("train_export_speculators_demo");
  const TargetConfig target = load_target_config(testing::model_dir());
  const int64_t V = target.vocab_size, H = target.hidden_size, K = 128;
  ASSERT_EQ(V, 512);
  ASSERT_EQ(H, 64);
  DraftVocab vocab;
  vocab.t2d.assign(static_cast<size_t>(V), 0);
  std::vector<int64_t> selected;
  for (int64_t i = 0; i < K; ++i) selected.push_back(i < 64 ? i : 64 + 7 * (i - 64));  // ascending, < 512
  for (size_t i = 0; i < selected.size(); ++i) {
    vocab.d2t.push_back(selected[i] - static_cast<int64_t>(i));
    vocab.t2d[static_cast<size_t>(selected[i])] = 1;
  }
  const DraftConfig cfg = DraftConfig::from_target(target, K, {2, 3, 4});
  std::mt19937_64 rng(5);
  const DraftWeights w = init_draft_weights(cfg, testing::random_f32({V, H}, rng, 1.0), selected, 7);

  write_export(dir + "/eagle3", cfg, w, vocab, target);
  SpeculatorsOptions o;
  o.verifier = testing::model_dir();
  write_speculators_export(dir + "/speculators", cfg, w, vocab, target, o);
  // The directory holds what the default export holds: config.json and model.safetensors.
  std::set<std::string> files;
  for (const auto& e : fs::directory_iterator(dir + "/speculators")) files.insert(e.path().filename().string());
  EXPECT_EQ(files, (std::set<std::string>{"config.json", "model.safetensors"}));

  // The tensors, written out from [S5] / [V4] for this model (no embed_tokens: [S6], [V4]).
  const std::map<std::string, std::pair<std::string, Shape>> want = {
      {"fc.weight", {"BF16", {64, 192}}},  // [H, 3 Ht]
      {"layers.0.self_attn.q_proj.weight", {"BF16", {64, 128}}},  // [heads x head_dim, 2 H]
      {"layers.0.self_attn.k_proj.weight", {"BF16", {32, 128}}},
      {"layers.0.self_attn.v_proj.weight", {"BF16", {32, 128}}},
      {"layers.0.self_attn.o_proj.weight", {"BF16", {64, 64}}},
      {"layers.0.mlp.gate_proj.weight", {"BF16", {172, 64}}},
      {"layers.0.mlp.up_proj.weight", {"BF16", {172, 64}}},
      {"layers.0.mlp.down_proj.weight", {"BF16", {64, 172}}},
      {"layers.0.input_layernorm.weight", {"BF16", {64}}},
      {"layers.0.hidden_norm.weight", {"BF16", {64}}},
      {"layers.0.post_attention_layernorm.weight", {"BF16", {64}}},
      {"norm.weight", {"BF16", {64}}},
      {"lm_head.weight", {"BF16", {128, 64}}},  // [K, H]
      {"d2t", {"I64", {128}}},                  // long [K]
      {"t2d", {"BOOL", {512}}}};                // bool [V]
  const RawSafetensors spec = read_raw(dir + "/speculators/model.safetensors");
  const RawSafetensors def = read_raw(dir + "/eagle3/model.safetensors");
  std::set<std::string> names;
  for (auto& [k, v] : spec.header.items())
    if (k != "__metadata__") names.insert(k);
  std::set<std::string> want_names;
  for (const auto& [n, dt] : want) {
    want_names.insert(n);
    if (!spec.header.contains(n)) continue;
    EXPECT_EQ(spec.header[n]["dtype"], dt.first) << n;
    EXPECT_EQ(spec.header[n]["shape"].get<Shape>(), dt.second) << n;
  }
  EXPECT_EQ(names, want_names);
  EXPECT_EQ(spec.header["__metadata__"], def.header["__metadata__"]);  // format "pt", aerie_version
  // Values: the default export's bytes under the old name (midlayer.*), tensor by tensor.
  std::set<std::string> def_names;
  for (auto& [k, v] : def.header.items())
    if (k != "__metadata__") def_names.insert(k);
  EXPECT_EQ(def_names.size(), names.size());
  for (const auto& n : def_names) {
    const std::string sn = speculators_tensor_name(n);
    ASSERT_TRUE(spec.header.contains(sn)) << n;
    EXPECT_EQ(spec.header[sn]["dtype"], def.header[n]["dtype"]) << n;
    EXPECT_EQ(spec.header[sn]["shape"], def.header[n]["shape"]) << n;
    EXPECT_TRUE(spec.bytes_of(sn) == def.bytes_of(n)) << n << ": bytes differ from the default export's";
  }

  // The config for this model.
  const nlohmann::json j = nlohmann::json::parse(read_file(dir + "/speculators/config.json"));
  EXPECT_EQ(keys_of(j), kTopKeys);
  EXPECT_FALSE(j.contains("model_type"));  // [V1]
  EXPECT_EQ(j["speculators_model_type"], "eagle3");
  EXPECT_EQ(j["draft_vocab_size"], 128);
  EXPECT_EQ(j["eagle_aux_hidden_state_layer_ids"], nlohmann::json::array({2, 3, 4}));
  EXPECT_EQ(j["norm_before_residual"], false);
  EXPECT_EQ(j["speculators_config"]["verifier"]["name_or_path"], testing::model_dir());
  EXPECT_EQ(j["speculators_config"]["verifier"]["architectures"], nlohmann::json::array({"LlamaForCausalLM"}));
  EXPECT_EQ(j["speculators_config"]["proposal_methods"][0]["speculative_tokens"], 3);
  const nlohmann::json& l = j["transformer_layer_config"];
  EXPECT_EQ(keys_of(l), kLayerKeys);
  const nlohmann::json want_layer = {{"model_type", "llama"},     {"hidden_size", 64},
                                     {"num_attention_heads", 8},  {"num_key_value_heads", 4},
                                     {"head_dim", 8},             {"intermediate_size", 172},
                                     {"num_hidden_layers", 1},    {"rms_norm_eps", 1e-5},
                                     {"vocab_size", 512},         {"max_position_embeddings", 512},
                                     {"rope_theta", 10000.0},     {"rope_scaling", nullptr},
                                     {"tie_word_embeddings", false}, {"torch_dtype", "bfloat16"},
                                     {"hidden_act", "silu"}};
  EXPECT_EQ(l, want_layer);

  // load_export reads the speculators export as it reads the default one (eval can use either).
  const ExportedDraft a = load_export(dir + "/eagle3", target.num_hidden_layers);
  const ExportedDraft b = load_export(dir + "/speculators", target.num_hidden_layers);
  EXPECT_EQ(b.config.to_json(), a.config.to_json());
  EXPECT_EQ(b.config.aux_layers, (std::vector<int>{2, 3, 4}));
  EXPECT_EQ(b.vocab.d2t, a.vocab.d2t);
  EXPECT_EQ(b.vocab.t2d, a.vocab.t2d);
  auto ga = a.weights.named(), gb = b.weights.named();
  for (size_t i = 0; i < ga.size(); ++i)
    EXPECT_EQ(gb[i].second->to_float_vector(), ga[i].second->to_float_vector()) << ga[i].first;
  // Without the target's depth the ids come from the config (written always, unlike the default export).
  EXPECT_EQ(load_export(dir + "/speculators").config.aux_layers, (std::vector<int>{2, 3, 4}));
}

// A speculators config aerie cannot run (fc_norm) is refused by load_export's reader, naming the key.
// norm_before_residual (EAGLE-3.1's residual base, DraftConfig::norm_before_residual) is read: true, or
// absent (true to vLLM [V3]), gives a draft with the option, and an export of such a draft writes true.
TEST(ExportSpeculatorsTest, ReaderRefusesDraftsAerieDoesNotRun) {
  const std::string dir = testing::scratch_dir("train_export_speculators_reader");
  auto s = testing::make_tiny_setup(dir, {1, 3, 5});
  SpeculatorsOptions o;
  o.verifier = dir;
  const nlohmann::json j = speculators_export_config(s.cfg, s.target, o);
  const nlohmann::json e = eagle3_config_from_speculators(j);
  EXPECT_EQ(e["draft_vocab_size"], 10);
  EXPECT_EQ(e["eagle_config"]["eagle_aux_hidden_state_layer_ids"], nlohmann::json::array({1, 3, 5}));
  EXPECT_EQ(DraftConfig::from_json(e).to_json(), DraftConfig::from_json(export_config(s.cfg, s.target)).to_json());
  EXPECT_FALSE(DraftConfig::from_json(e).norm_before_residual);
  {
    nlohmann::json bad = j;
    bad["fc_norm"] = true;  // read (aerie runs it), but not together with norm_before_fc
    EXPECT_TRUE(DraftConfig::from_json(eagle3_config_from_speculators(bad)).fc_norm);
    bad["norm_before_fc"] = true;
    EXPECT_NE(testing::error_of([&] { DraftConfig::from_json(eagle3_config_from_speculators(bad)); }).find("fc_norm"),
              std::string::npos);
    bad = j;
    bad["norm_before_fc"] = "yes";  // not a bool: refused by name
    EXPECT_NE(testing::error_of([&] { eagle3_config_from_speculators(bad); }).find("norm_before_fc"),
              std::string::npos);
  }
  // norm_before_fc (EAGLE-3.1's input_norm before fc [V7] [V8] [G2] [S8]): false in a plain export, read
  // when true, written as trained by both exports (the default export only when on).
  EXPECT_EQ(j["norm_before_fc"], false);
  EXPECT_FALSE(DraftConfig::from_json(e).norm_before_fc);
  nlohmann::json nbf = j;
  nbf["norm_before_fc"] = true;
  EXPECT_TRUE(DraftConfig::from_json(eagle3_config_from_speculators(nbf)).norm_before_fc);
  DraftConfig with_fc = s.cfg;
  with_fc.norm_before_fc = true;
  EXPECT_EQ(speculators_export_config(with_fc, s.target, o)["norm_before_fc"], true);
  EXPECT_FALSE(speculators_export_config(with_fc, s.target, o)["transformer_layer_config"].contains("norm_before_fc"));
  EXPECT_EQ(export_config(with_fc, s.target)["norm_before_fc"], true);
  EXPECT_FALSE(export_config(s.cfg, s.target).contains("norm_before_fc"));
  EXPECT_TRUE(DraftConfig::from_json(export_config(with_fc, s.target)).norm_before_fc);
  nlohmann::json nbr = j;
  nbr["norm_before_residual"] = true;
  EXPECT_TRUE(DraftConfig::from_json(eagle3_config_from_speculators(nbr)).norm_before_residual);
  nlohmann::json absent = j;
  absent.erase("norm_before_residual");
  EXPECT_TRUE(DraftConfig::from_json(eagle3_config_from_speculators(absent)).norm_before_residual);
  DraftConfig with = s.cfg;
  with.norm_before_residual = true;
  EXPECT_EQ(speculators_export_config(with, s.target, o)["norm_before_residual"], true);
  EXPECT_EQ(export_config(with, s.target)["norm_before_residual"], true);  // the default export's field
  EXPECT_FALSE(export_config(s.cfg, s.target).contains("norm_before_residual"));
  EXPECT_TRUE(DraftConfig::from_json(export_config(with, s.target)).norm_before_residual);
  // norm_output (EAGLE-3.1's norm(o) handed on [V6] [G1] [S7]): false in a plain export, read when true,
  // written as trained by both exports (the default export only when on).
  EXPECT_EQ(j["norm_output"], false);
  EXPECT_FALSE(DraftConfig::from_json(e).norm_output);
  nlohmann::json nout = j;
  nout["norm_output"] = true;
  EXPECT_TRUE(DraftConfig::from_json(eagle3_config_from_speculators(nout)).norm_output);
  with.norm_output = true;
  EXPECT_EQ(speculators_export_config(with, s.target, o)["norm_output"], true);
  EXPECT_EQ(export_config(with, s.target)["norm_output"], true);
  EXPECT_FALSE(export_config(s.cfg, s.target).contains("norm_output"));
  EXPECT_TRUE(DraftConfig::from_json(export_config(with, s.target)).norm_output);
  nlohmann::json other = j;
  other["speculators_model_type"] = "mtp";
  EXPECT_THROW(eagle3_config_from_speculators(other), Error);
  other = j;
  other["transformer_layer_config"]["model_type"] = "qwen3";
  EXPECT_THROW(eagle3_config_from_speculators(other), Error);
}

// A draft trained with norm_before_fc: both exports hold the trained weight as "input_norm.weight" BF16
// [3 H_t] (top level, not under midlayer. / layers.0.: [V7] [G2] [S8]) with the same bytes, config
// norm_before_fc true (top level in both [V7] [V8]); load_export reads either back (eval decodes with it),
// and the weights / config must agree.
TEST(ExportSpeculatorsTest, NormBeforeFcExportsInputNorm) {
  const std::string dir = testing::scratch_dir("train_export_speculators_norm_before_fc");
  auto s = testing::make_tiny_setup(dir, {1, 3, 5});
  DraftConfig cfg = s.cfg;
  cfg.norm_before_fc = true;
  DraftWeights w = s.w;
  w.input_norm = Tensor::empty({3 * cfg.target_hidden_size}, DType::F32);
  for (int64_t i = 0; i < w.input_norm.numel(); ++i) w.input_norm.data<float>()[i] = 0.5f + 0.0625f * i;
  SpeculatorsOptions o;
  o.verifier = dir;
  write_export(dir + "/eagle3", cfg, w, s.vocab, s.target);
  write_speculators_export(dir + "/speculators", cfg, w, s.vocab, s.target, o);
  const RawSafetensors def = read_raw(dir + "/eagle3/model.safetensors");
  const RawSafetensors spec = read_raw(dir + "/speculators/model.safetensors");
  for (const RawSafetensors* f : {&def, &spec}) {
    ASSERT_TRUE(f->header.contains("input_norm.weight"));
    EXPECT_EQ(f->header["input_norm.weight"]["dtype"], "BF16");
    EXPECT_EQ(f->header["input_norm.weight"]["shape"].get<Shape>(), (Shape{24}));  // 3 H_t, H_t = 8
  }
  EXPECT_TRUE(spec.bytes_of("input_norm.weight") == def.bytes_of("input_norm.weight"));
  EXPECT_EQ(def.header.size(), 13u + 1 + 2 + 1);  // 13 weights, input_norm, d2t, t2d, __metadata__
  EXPECT_EQ(nlohmann::json::parse(read_file(dir + "/eagle3/config.json"))["norm_before_fc"], true);
  EXPECT_EQ(nlohmann::json::parse(read_file(dir + "/speculators/config.json"))["norm_before_fc"], true);
  for (const char* sub : {"/eagle3", "/speculators"}) {
    const ExportedDraft d = load_export(dir + sub);
    EXPECT_TRUE(d.config.norm_before_fc) << sub;
    ASSERT_TRUE(d.weights.input_norm.defined()) << sub;
    EXPECT_EQ(d.weights.input_norm.to_float_vector(), w.input_norm.to_float_vector()) << sub;  // exact in bf16
    EXPECT_EQ(d.weights.named().size(), 14u) << sub;
  }
  // A plain export has no input_norm; weights that do not match the config are refused by name.
  write_export(dir + "/plain", s.cfg, s.w, s.vocab, s.target);
  EXPECT_FALSE(read_raw(dir + "/plain/model.safetensors").header.contains("input_norm.weight"));
  EXPECT_FALSE(load_export(dir + "/plain").weights.input_norm.defined());
  EXPECT_NE(testing::error_of([&] { export_tensors(cfg, s.w, s.vocab); }).find("input_norm"), std::string::npos);
  EXPECT_NE(testing::error_of([&] { export_tensors(s.cfg, w, s.vocab); }).find("input_norm"), std::string::npos);
  // An export whose config says norm_before_fc but whose tensors lack input_norm.weight is refused naming it.
  fs::copy_file(dir + "/plain/model.safetensors", dir + "/eagle3/model.safetensors",
                fs::copy_options::overwrite_existing);
  EXPECT_NE(testing::error_of([&] { load_export(dir + "/eagle3"); }).find("input_norm.weight"), std::string::npos);
}

// The checkpoint record (export --best and every export, jobs/export.cc): given the same source, the
// speculators export writes the default export's config.json "aerie_checkpoint" and metadata
// checkpoint_step / checkpoint_selected_by; load_export still reads it; a source without an integer step is
// refused by both writers before anything is written.
TEST(ExportSpeculatorsTest, RecordsTheCheckpointAsTheDefaultExportDoes) {
  const std::string dir = testing::scratch_dir("train_export_speculators_source");
  auto s = testing::make_tiny_setup(dir, {2, 3, 4});
  SpeculatorsOptions o;
  o.verifier = "org/target";
  const nlohmann::json source = {{"checkpoint", dir + "/run/checkpoints/step-00000020"},
                                 {"step", 20},
                                 {"selected_by", "best_acceptance_length"},
                                 {"acceptance_length", 2.5},
                                 {"eval_table", dir + "/run/checkpoint_eval.json"}};
  write_export(dir + "/eagle3", s.cfg, s.w, s.vocab, s.target, ServingEngine::Any, source);
  write_speculators_export(dir + "/speculators", s.cfg, s.w, s.vocab, s.target, o, source);
  const nlohmann::json je = nlohmann::json::parse(read_file(dir + "/eagle3/config.json"));
  const nlohmann::json js = nlohmann::json::parse(read_file(dir + "/speculators/config.json"));
  EXPECT_EQ(je["aerie_checkpoint"], source);
  EXPECT_EQ(js["aerie_checkpoint"], source);
  std::set<std::string> want_keys = kTopKeys;
  want_keys.insert("aerie_checkpoint");
  EXPECT_EQ(keys_of(js), want_keys);
  const nlohmann::json me = read_raw(dir + "/eagle3/model.safetensors").header["__metadata__"];
  const nlohmann::json ms = read_raw(dir + "/speculators/model.safetensors").header["__metadata__"];
  EXPECT_EQ(ms, me);
  EXPECT_EQ(ms["checkpoint_step"], "20");
  EXPECT_EQ(ms["checkpoint_selected_by"], "best_acceptance_length");
  EXPECT_EQ(ms["format"], "pt");
  // The reader ignores the record.
  EXPECT_EQ(load_export(dir + "/speculators").config.to_json(), load_export(dir + "/eagle3").config.to_json());

  // A source without an integer step: refused, nothing written.
  const nlohmann::json bad = {{"checkpoint", "x"}, {"selected_by", "given"}};
  const std::string e1 = testing::error_of(
      [&] { write_speculators_export(dir + "/bad_spec", s.cfg, s.w, s.vocab, s.target, o, bad); });
  const std::string e2 = testing::error_of(
      [&] { write_export(dir + "/bad_eagle3", s.cfg, s.w, s.vocab, s.target, ServingEngine::Any, bad); });
  EXPECT_NE(e1.find("has no integer step"), std::string::npos) << e1;
  EXPECT_NE(e2.find("has no integer step"), std::string::npos) << e2;
  EXPECT_FALSE(fs::exists(dir + "/bad_spec"));
  EXPECT_FALSE(fs::exists(dir + "/bad_eagle3"));
}
// A draft trained with fc_norm: both exports hold the three trained norms as "fc_norm.{0,1,2}.weight" BF16
// [H_t] (top level, SpecForge 0.2.0's nn.ModuleList fc_norm of LlamaForCausalLMEagle3) with the same bytes,
// config fc_norm true (top level in both: SpecForge's getattr(config, "fc_norm", False), speculators'
// config.fc_norm [V8]); load_export reads either back; `--for sglang` refuses it by name, `--for vllm`
// writes it.
TEST(ExportSpeculatorsTest, FcNormExportsThreeNorms) {
  const std::string dir = testing::scratch_dir("train_export_speculators_fc_norm");
  auto s = testing::make_tiny_setup(dir, {1, 3, 5});
  DraftConfig cfg = s.cfg;
  cfg.fc_norm = true;
  DraftWeights w = s.w;
  for (int k = 0; k < 3; ++k) {
    w.fc_norm[k] = Tensor::empty({cfg.target_hidden_size}, DType::F32);
    for (int64_t i = 0; i < cfg.target_hidden_size; ++i) w.fc_norm[k].data<float>()[i] = 0.5f + 0.125f * i + k;
  }
  SpeculatorsOptions o;
  o.verifier = dir;
  write_export(dir + "/eagle3", cfg, w, s.vocab, s.target, ServingEngine::Vllm);
  write_speculators_export(dir + "/speculators", cfg, w, s.vocab, s.target, o);
  const RawSafetensors def = read_raw(dir + "/eagle3/model.safetensors");
  const RawSafetensors spec = read_raw(dir + "/speculators/model.safetensors");
  for (const char* name : {"fc_norm.0.weight", "fc_norm.1.weight", "fc_norm.2.weight"})
    for (const RawSafetensors* f : {&def, &spec}) {
      ASSERT_TRUE(f->header.contains(name)) << name;
      EXPECT_EQ((*f).header[name]["dtype"], "BF16");
      EXPECT_EQ((*f).header[name]["shape"].get<Shape>(), (Shape{8})) << name;  // H_t = 8
      EXPECT_TRUE(spec.bytes_of(name) == def.bytes_of(name)) << name;
    }
  EXPECT_EQ(def.header.size(), 13u + 3 + 2 + 1);  // 13 weights, 3 norms, d2t, t2d, __metadata__
  EXPECT_EQ(nlohmann::json::parse(read_file(dir + "/eagle3/config.json"))["fc_norm"], true);
  const nlohmann::json spec_cfg = nlohmann::json::parse(read_file(dir + "/speculators/config.json"));
  EXPECT_EQ(spec_cfg["fc_norm"], true);
  EXPECT_FALSE(spec_cfg["transformer_layer_config"].contains("fc_norm"))
      << "fc_norm is a top-level key of the speculators config, as norm_before_fc [V8]";
  for (const char* sub : {"/eagle3", "/speculators"}) {
    const ExportedDraft d = load_export(dir + sub);
    EXPECT_TRUE(d.config.fc_norm) << sub;
    for (int k = 0; k < 3; ++k) {
      ASSERT_TRUE(d.weights.fc_norm[k].defined()) << sub;
      EXPECT_EQ(d.weights.fc_norm[k].to_float_vector(), w.fc_norm[k].to_float_vector()) << sub;  // exact in bf16
    }
  }
  // The speculators config with the top-level key turned off: its tensors are refused, not run as fc_norm.
  nlohmann::json off = spec_cfg;
  off["fc_norm"] = false;
  write_file_atomic(dir + "/speculators/config.json", off.dump());
  EXPECT_NE(testing::error_of([&] { load_export(dir + "/speculators"); }).find("holds fc_norm.0.weight"),
            std::string::npos);
  // SGLang reads fc_norm from 0.5.12 on (sglang==0.5.12 srt/models/llama_eagle3.py); an earlier release is refused.
  const std::string err = testing::error_of(
      [&] { write_export(dir + "/sglang", cfg, w, s.vocab, s.target, serving_target_from_string("sglang==0.5.11")); });
  EXPECT_NE(err.find("SGLang 0.5.11 does not serve fc_norm: the first release that does is 0.5.12"), std::string::npos)
      << err;
  EXPECT_FALSE(fs::exists(dir + "/sglang/model.safetensors"));
  EXPECT_NE(testing::error_of([&] { export_tensors(cfg, s.w, s.vocab); }).find("fc_norm"), std::string::npos);
}


}  // namespace
}  // namespace aerie
