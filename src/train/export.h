// The export of a trained draft: the directory vLLM and SGLang load as an EAGLE-3 draft
// (eagle3.md section 5; LlamaForCausalLMEagle3 in vllm/sglang llama_eagle3.py):
//   config.json        architectures ["LlamaForCausalLMEagle3"], model_type "llama", the layer shapes,
//                      num_hidden_layers 1, vocab_size V, draft_vocab_size K, max_position_embeddings,
//                      rope_theta and rope_scaling copied from the target, tie_word_embeddings false,
//                      torch_dtype "bfloat16", target_hidden_size only when it differs from hidden_size,
//                      eagle_config.eagle_aux_hidden_state_layer_ids only when the aux layers are not the
//                      default (2, N/2, N-3) (aerie's = vLLM's input-of-layer-k convention)
//   model.safetensors  bf16 weights under DraftWeights::named() (fc.weight, midlayer.*, norm.weight,
//                      lm_head.weight), d2t I64 [K], t2d BOOL [V]; no embed_tokens (servers share the
//                      target's); metadata {"format": "pt"} as transformers expects
// `export --format speculators` writes the same tensors in the layout of the speculators library
// (vllm-project/speculators, Eagle3SpeculatorConfig), which `vllm serve DRAFT_DIR` opens by itself: see
// speculators_export_config below and docs/formats.md "The speculators format".
// load_export reads either layout back (eval uses it).
#pragma once
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "data/vocab.h"
#include "io/safetensors.h"
#include "model/draft.h"
#include "model/target_config.h"
#include "train/serving_engines.h"

namespace aerie {

/// The config.json of the export for draft `cfg` of `target`, served by `serving`: the aux ids (aerie's,
/// vLLM's input-of-layer-k convention) always at the top level (eagle_aux_hidden_state_layer_ids, where
/// vLLM takes its capture list) and in eagle_config (where SGLang reads them, in the convention of the
/// release: eagle_config_aux_ids). Throws aerie::Error if the draft does not fit the target (V, H, the layer
/// count the draft was trained with when it records one, or the aux layer range differ) or when no list
/// makes `serving` capture the aux layers.
nlohmann::json export_config(const DraftConfig& cfg, const TargetConfig& target, const ServingTarget& serving = {});

/// Writes the export directory `out_dir`: into "<out_dir>.tmp" first (a stale one is removed), then
/// renamed to out_dir (an existing out_dir is replaced). An existing out_dir, .tmp or .old that holds
/// anything but config.json / model.safetensors is an aerie::Error naming the file (nothing is removed). Weights are rounded to bf16 (nearest even).
/// Throws aerie::Error on inconsistent shapes or I/O failure.
/// `engine`: Any logs a warning for each thing SGLang would read or run otherwise than trained and the first
/// vLLM and SGLang releases that serve the export; Vllm or Sglang (with a release, or the newest checked)
/// throws aerie::Error naming every need that release does not meet (serving_needs: the target family, the
/// MLA draft, the EAGLE-3.1 norms, the window, the aux ids), with the first release that does (nothing is
/// written then). The MLA draft for SGLang is named Eagle3DeepseekV2ForCausalLM, as its releases register it.
/// `source`: the checkpoint exported, an object {"checkpoint": its folder, "step", "selected_by": "given"
/// (a step folder), "newest" (a run's newest) or "best_acceptance_length" (export --best, with
/// "acceptance_length" and "eval_table": the checkpoint table it was chosen from)}; written as config.json's
/// "aerie_checkpoint" (a key section 5 does not have; vLLM and SGLang ignore it) and as the
/// model.safetensors metadata "checkpoint_step" and "checkpoint_selected_by". null: neither is written.
void write_export(const std::string& out_dir, const DraftConfig& cfg, const DraftWeights& weights,
                  const DraftVocab& vocab, const TargetConfig& target, const ServingTarget& engine = {},
                  const nlohmann::json& source = nullptr);

/// Refuses an export of draft `cfg` for `target` in `format` ("eagle3", "speculators") that `serving`
/// (an engine and its release, or the newest checked) would not serve as trained: throws aerie::Error naming
/// every unmet need (serving_needs) with the first release that meets it, and for SGLang 0.5.14 on aux ids
/// it would misread. ServingEngine::Any: logs a warning for each thing SGLang would read otherwise and the
/// first vLLM and SGLang releases that serve the export. Otherwise logs the first release that serves it.
void check_serving_target(const DraftConfig& cfg, const TargetConfig& target, const ServingTarget& serving,
                          const std::string& format);

/// The tensors of an export: every DraftWeights::named() tensor rounded to BF16 (nearest even) under its
/// name (fc.weight, midlayer.*, norm.weight, lm_head.weight, and input_norm.weight [3 H_t] under
/// norm_before_fc), d2t I64 [K], t2d U8 [V] (saved as BOOL); metadata {"format": "pt", "aerie_version"}.
/// Throws aerie::Error when the weights' tensors or shapes are not cfg's (input_norm exactly with
/// norm_before_fc) or d2t/t2d's sizes are not cfg's K and V.
SafetensorsFile export_tensors(const DraftConfig& cfg, const DraftWeights& weights, const DraftVocab& vocab);

/// Records the checkpoint exported, `source` (the object write_export takes), in an export: config's
/// "aerie_checkpoint" = source, tensors' metadata "checkpoint_step" (source's step) and
/// "checkpoint_selected_by" (its selected_by, "given" without one). null: nothing is recorded. Throws
/// aerie::Error when source is not an object with an integer "step".
void record_export_checkpoint(nlohmann::json& config, SafetensorsFile& tensors, const nlohmann::json& source);

/// Writes `config` (as config.json) and `tensors` (as model.safetensors, t2d as BOOL) into out_dir the way
/// write_export does: into "<out_dir>.tmp", then renamed; an existing out_dir, .tmp or .old that holds
/// anything but config.json / model.safetensors is an aerie::Error naming the file (nothing is removed).
void write_export_dir(const std::string& out_dir, const nlohmann::json& config, const SafetensorsFile& tensors);

/// The layout `aerie export --format` writes:
///  - Eagle3 (the default): eagle3.md section 5, LlamaForCausalLMEagle3, which vLLM (--speculative-config)
///    and SGLang (--speculative-draft-model-path) load;
///  - Speculators: the speculators library's EAGLE-3 layout (speculators_model_type "eagle3"), which vLLM
///    opens as `vllm serve DRAFT_DIR`, the target named in the config (speculators_config.verifier).
enum class ExportFormat { Eagle3, Speculators };
/// Parses "eagle3", "speculators". Throws aerie::Error naming the value otherwise.
ExportFormat export_format_from_string(const std::string& s);

/// What a speculators config holds beyond the draft itself.
struct SpeculatorsOptions {
  /// speculators_config.verifier.name_or_path: the target vLLM loads for `vllm serve DRAFT_DIR` (a Hugging
  /// Face id or a path on the serving machine). Must not be empty.
  std::string verifier;
  /// speculators_config.proposal_methods[0].speculative_tokens: vLLM's num_speculative_tokens (>= 1).
  int speculative_tokens = 3;
  /// `export --for`: the vLLM release (or any) whose serving of the export is checked (check_serving_target).
  ServingTarget serving;
};

/// The config.json of a speculators export of draft `cfg` for `target` (the keys vLLM's speculators
/// loader and speculators' Eagle3SpeculatorConfig read; docs/formats.md):
///   speculators_model_type "eagle3", architectures ["Eagle3Speculator"],
///   transformer_layer_config = export_config's Llama layer keys (model_type "llama", widths,
///     num_hidden_layers 1, vocab_size V, positions, rope, torch_dtype "bfloat16", ...),
///   draft_vocab_size K, target_hidden_size (null when equal to hidden_size), norm_before_residual and
///   norm_output as trained (DraftConfig; both always written: vLLM's default without norm_before_residual
///   is true), norm_before_fc and fc_norm as trained (always written), eagle_aux_hidden_state_layer_ids (always written, aerie's
///   = vLLM's input-of-layer-k ids), speculators_config {algorithm "eagle3", proposal_methods [greedy,
///   speculative_tokens], default_proposal_method "greedy", verifier {name_or_path, architectures (the
///   target's config.json architectures)}}, tie_word_embeddings false, torch_dtype, aerie_version.
/// Throws aerie::Error as export_config does, and when opts.verifier is empty or speculative_tokens < 1.
nlohmann::json speculators_export_config(const DraftConfig& cfg, const TargetConfig& target,
                                         const SpeculatorsOptions& opts);

/// The speculators name of an export tensor: "midlayer.X" -> "layers.0.X" (the decoder layer of a
/// one-layer draft), any other name unchanged (fc.weight, norm.weight, lm_head.weight, d2t, t2d).
std::string speculators_tensor_name(const std::string& name);

/// Writes a speculators export into out_dir (replaced as write_export does): config.json from
/// speculators_export_config and model.safetensors holding export_tensors' tensors, values and dtypes
/// unchanged (BF16 weights, d2t I64 [K], t2d BOOL [V]), under speculators_tensor_name. No embed_tokens
/// (vLLM and speculators share the target's). `source` is recorded as write_export records it (config.json's
/// "aerie_checkpoint", the metadata "checkpoint_step" and "checkpoint_selected_by"; speculators keeps the
/// extra key, vLLM ignores it). Throws aerie::Error as write_export and speculators_export_config do.
void write_speculators_export(const std::string& out_dir, const DraftConfig& cfg, const DraftWeights& weights,
                              const DraftVocab& vocab, const TargetConfig& target, const SpeculatorsOptions& opts,
                              const nlohmann::json& source = nullptr);

/// A speculators config.json (speculators_model_type "eagle3") as the equivalent LlamaForCausalLMEagle3
/// config (eagle3.md section 5) that DraftConfig::from_json reads: transformer_layer_config with
/// draft_vocab_size, target_hidden_size and the aux ids (as eagle_config) of the top level. Throws
/// aerie::Error for another speculators_model_type, a transformer_layer_config that is not a "llama"
/// object, or one of the four norm switches that is not a bool.
/// norm_before_residual (absent: true, vLLM's default), norm_output and norm_before_fc (absent: false) are
/// carried over.
nlohmann::json eagle3_config_from_speculators(const nlohmann::json& speculators_config);

/// A draft read back from an export directory: weights converted to F32.
struct ExportedDraft {
  DraftConfig config;
  DraftWeights weights;
  DraftVocab vocab;
};

/// Reads an export directory (aerie's or any LlamaForCausalLMEagle3 one with d2t/t2d, or a speculators
/// EAGLE-3 one: its config through eagle3_config_from_speculators, its tensors under
/// speculators_tensor_name). Aux layers come from eagle_config.eagle_aux_hidden_state_layer_ids (a
/// speculators config's top-level eagle_aux_hidden_state_layer_ids), else
/// default_aux_layers(target_num_hidden_layers) when that is > 0, else stay empty (the config does not name the target's depth). Throws aerie::Error
/// naming the file and tensor on a missing tensor, a wrong shape or dtype, or d2t/t2d that disagree, and on
/// a trained weight the config does not switch on (input_norm.weight without norm_before_fc, fc_norm.* without fc_norm);
/// other tensors the draft does not read (embed_tokens of some exporters) are named in a warning.
ExportedDraft load_export(const std::string& dir, int64_t target_num_hidden_layers = 0);

}  // namespace aerie
