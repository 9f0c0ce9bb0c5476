// `aerie export --format speculators`: the draft in the speculators library's EAGLE-3 layout, which
// `vllm serve DRAFT_DIR` opens by itself (it reads the target from speculators_config.verifier). The keys
// and names follow the loaders' code, cited in tests/train/export_speculators_test.cc: speculators'
// Eagle3SpeculatorConfig (src/speculators/models/eagle3/config.py) and its converter of EAGLE-3
// checkpoints (src/speculators/convert/eagle/eagle3_converter.py: midlayer. -> layers.0.), vLLM's
// speculators config (vllm/transformers_utils/configs/speculators/{base,algos}.py) and its EAGLE-3 draft
// (vllm/model_executor/models/llama_eagle3.py).
#include <utility>

#include "core/version.h"
#include "train/export.h"

namespace aerie {

namespace {

// The keys of export_config that describe the draft's decoder layer (transformer_layer_config); the
// others are EAGLE-3 fields that the speculators format keeps at the top level, or none of the format's.
bool is_layer_key(const std::string& k) {
  return k != "architectures" && k != "draft_vocab_size" && k != "target_hidden_size" && k != "eagle_config" &&
         k != "aerie_version" && k != "norm_before_residual" && k != "norm_output" &&
         k != "norm_before_fc" && k != "fc_norm" &&
         k != "eagle_aux_hidden_state_layer_ids";  // top-level keys of the speculators config
}

}  // namespace

ExportFormat export_format_from_string(const std::string& s) {
  if (s == "eagle3") return ExportFormat::Eagle3;
  if (s == "speculators") return ExportFormat::Speculators;
  AERIE_THROW("export: --format " << s << ": want eagle3 or speculators");
}

std::string speculators_tensor_name(const std::string& name) {
  static const std::string from = "midlayer.";
  return name.rfind(from, 0) == 0 ? "layers.0." + name.substr(from.size()) : name;
}

nlohmann::json speculators_export_config(const DraftConfig& cfg, const TargetConfig& target,
                                         const SpeculatorsOptions& opts) {
  AERIE_CHECK(!cfg.is_mla(), "export --format speculators: speculators' Eagle3 draft is a Llama layer (its "
                             "transformer_layer_config is a LlamaConfig); the MLA draft exports with --format eagle3, "
                             "the config and tensor names vLLM's Eagle3DeepseekV2ForCausalLM loads");
  AERIE_CHECK(!opts.verifier.empty(), "export --format speculators: the verifier (name_or_path) is empty");
  AERIE_CHECK(opts.speculative_tokens >= 1,
              "export --format speculators: speculative_tokens " << opts.speculative_tokens << " is not >= 1");
  // The same checks and values as the default export (the rope and positions copied from the target).
  const nlohmann::json eagle3 = export_config(cfg, target);
  nlohmann::json layer = nlohmann::json::object();
  for (auto& [k, v] : eagle3.items())
    if (is_layer_key(k)) layer[k] = v;
  const nlohmann::json& raw = target.raw;
  const nlohmann::json architectures =
      raw.is_object() && raw.contains("architectures") && raw["architectures"].is_array() ? raw["architectures"]
                                                                                          : nlohmann::json::array();
  nlohmann::json j;
  j["speculators_model_type"] = "eagle3";
  j["architectures"] = {"Eagle3Speculator"};
  j["transformer_layer_config"] = layer;
  j["draft_vocab_size"] = cfg.draft_vocab_size;
  j["target_hidden_size"] =
      cfg.target_hidden_size != cfg.hidden_size ? nlohmann::json(cfg.target_hidden_size) : nlohmann::json();
  // The draft's residual base: the un-normed hidden state (vLLM's _norm_after_residual) unless trained
  // with --draft-norm-before-residual; vLLM's update_eagle3 takes true when the key is absent, so it is
  // always written.
  j["norm_before_residual"] = cfg.norm_before_residual;
  j["norm_before_fc"] = cfg.norm_before_fc;  // input_norm.weight [3 H_t] in the tensors when true
  j["fc_norm"] = cfg.fc_norm;  // fc_norm.{0,1,2}.weight [H_t] in the tensors when true
  j["norm_output"] = cfg.norm_output;
  // Always written: the config then names the target depths without aerie's private block, and vLLM
  // reads explicit ids as inputs of layer k, aerie's convention (its default (2, N/2, N-3) reads the same).
  j["eagle_aux_hidden_state_layer_ids"] = cfg.aux_layers;
  // The ids where EAGLE-3 configs also keep them (as the default format writes them); vLLM does not read it
  // here (vllm==0.26.0 vllm/transformers_utils/configs/speculators/base.py:60 builds the draft's config from
  // transformer_layer_config and the algorithm's fields).
  j["eagle_config"] = eagle3["eagle_config"];
  j["speculators_config"] = {
      {"algorithm", "eagle3"},
      {"proposal_methods",
       {{{"proposal_type", "greedy"},
         {"speculative_tokens", opts.speculative_tokens},
         {"verifier_accept_k", 1},
         {"accept_tolerance", 0.0}}}},
      {"default_proposal_method", "greedy"},
      {"verifier", {{"name_or_path", opts.verifier}, {"architectures", architectures}}}};
  j["tie_word_embeddings"] = false;  // PretrainedConfig's default is true; lm_head [K, H] is not embed_tokens
  j["torch_dtype"] = "bfloat16";
  j["aerie_version"] = aerie_version_string();  // who wrote it (speculators keeps extra keys, vLLM ignores it)
  return j;
}

void write_speculators_export(const std::string& out_dir, const DraftConfig& cfg, const DraftWeights& weights,
                              const DraftVocab& vocab, const TargetConfig& target, const SpeculatorsOptions& opts,
                              const nlohmann::json& source) {
  check_serving_target(cfg, target, opts.serving, "speculators");
  nlohmann::json config = speculators_export_config(cfg, target, opts);
  SafetensorsFile eagle3 = export_tensors(cfg, weights, vocab);
  SafetensorsFile f;
  f.metadata = eagle3.metadata;
  for (auto& [name, t] : eagle3.tensors) f.tensors[speculators_tensor_name(name)] = std::move(t);
  record_export_checkpoint(config, f, source);  // the same record as the default export's
  write_export_dir(out_dir, config, f);
}

nlohmann::json eagle3_config_from_speculators(const nlohmann::json& s) {
  const std::string type = s.value("speculators_model_type", std::string());
  AERIE_CHECK(type == "eagle3", "speculators config: speculators_model_type '" << type << "', want 'eagle3'");
  AERIE_CHECK(s.contains("transformer_layer_config") && s["transformer_layer_config"].is_object(),
              "speculators config: transformer_layer_config missing or not an object");
  nlohmann::json j = s["transformer_layer_config"];
  const std::string model_type = j.value("model_type", std::string("llama"));
  AERIE_CHECK(model_type == "llama", "speculators config: transformer_layer_config.model_type '"
                                         << model_type << "': aerie runs Llama draft layers only");
  // vLLM's defaults when a key is absent (algos.py update_eagle3): norm_before_residual true, the rest false.
  // aerie runs all four (DraftConfig), fc_norm not together with norm_before_fc (speculators refuses the pair).
  for (const char* key : {"norm_before_residual", "norm_output", "norm_before_fc", "fc_norm"})
    AERIE_CHECK(!s.contains(key) || s[key].is_boolean(),
                "speculators config: " << key << " must be true or false, got " << s[key].dump());
  j["norm_before_residual"] = s.value("norm_before_residual", true);
  if (s.value("norm_output", false)) j["norm_output"] = true;
  if (s.value("norm_before_fc", false)) j["norm_before_fc"] = true;
  if (s.value("fc_norm", false)) j["fc_norm"] = true;
  if (s.contains("draft_vocab_size")) j["draft_vocab_size"] = s["draft_vocab_size"];
  if (s.contains("target_hidden_size") && !s["target_hidden_size"].is_null())
    j["target_hidden_size"] = s["target_hidden_size"];
  if (s.contains("eagle_aux_hidden_state_layer_ids") && s["eagle_aux_hidden_state_layer_ids"].is_array()) {
    j["eagle_aux_hidden_state_layer_ids"] = s["eagle_aux_hidden_state_layer_ids"];
    j["eagle_config"] = {{"eagle_aux_hidden_state_layer_ids", s["eagle_aux_hidden_state_layer_ids"]}};
  }
  return j;
}

}  // namespace aerie
