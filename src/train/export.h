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
// and load_export, which reads such a directory back (eval uses it).
#pragma once
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "data/vocab.h"
#include "model/draft.h"
#include "model/target_config.h"

namespace aerie {

/// The config.json of the export for draft `cfg` of `target`. Throws aerie::Error if the draft does
/// not fit the target (V, H, the layer count the draft was trained with when it records one, or the aux
/// layer range differ).
nlohmann::json export_config(const DraftConfig& cfg, const TargetConfig& target);

/// The serving engine an export is written for (`aerie export --for`; docs/formats.md "Aux layer ids").
///  - Any: the ids in aerie's convention (input of decoder layer k, vLLM's), with a warning when an engine
///    would read them otherwise;
///  - Vllm: vLLM reads explicit ids as inputs of layer k (id N: the last layer's output);
///  - Sglang: SGLang since PR #25454 (2026-05-16) reads a list whose first id is 1 as output-of-layer ids
///    and adds 1 to every id, any other list as input-of-layer ids; before it, it added 1 to every list.
enum class ServingEngine { Any, Vllm, Sglang };
/// Parses "any", "vllm", "sglang". Throws aerie::Error naming the value otherwise.
ServingEngine serving_engine_from_string(const std::string& s);

/// How `engine` reads the aux layers `aux` (aerie's input-of-layer ids) of an export of a target of
/// `num_hidden_layers` layers: "" when as intended (or when the export writes no ids: the default
/// (2, N/2, N-3), which vLLM and SGLang both take as inputs of those layers), else a sentence saying
/// what the engine would capture instead.
std::string aux_ids_misread(const std::vector<int>& aux, int64_t num_hidden_layers, ServingEngine engine);

/// Writes the export directory `out_dir`: into "<out_dir>.tmp" first (a stale one is removed), then
/// renamed to out_dir (an existing out_dir is replaced). An existing out_dir, .tmp or .old that holds
/// anything but config.json / model.safetensors is an aerie::Error naming the file (nothing is removed). Weights are rounded to bf16 (nearest even).
/// Throws aerie::Error on inconsistent shapes or I/O failure.
/// `engine`: Any logs a warning when an engine would misread the aux ids; Vllm or Sglang throws
/// aerie::Error when that engine would (nothing is written then).
/// `source`: the checkpoint exported, an object {"checkpoint": its folder, "step", "selected_by": "given"
/// (a step folder), "newest" (a run's newest) or "best_acceptance_length" (export --best, with
/// "acceptance_length" and "eval_table": the checkpoint table it was chosen from)}; written as config.json's
/// "aerie_checkpoint" (a key section 5 does not have; vLLM and SGLang ignore it) and as the
/// model.safetensors metadata "checkpoint_step" and "checkpoint_selected_by". null: neither is written.
void write_export(const std::string& out_dir, const DraftConfig& cfg, const DraftWeights& weights,
                  const DraftVocab& vocab, const TargetConfig& target, ServingEngine engine = ServingEngine::Any,
                  const nlohmann::json& source = nullptr);

/// A draft read back from an export directory: weights converted to F32.
struct ExportedDraft {
  DraftConfig config;
  DraftWeights weights;
  DraftVocab vocab;
};

/// Reads an export directory (aerie's or any LlamaForCausalLMEagle3 one with d2t/t2d). Aux layers come
/// from eagle_config.eagle_aux_hidden_state_layer_ids, else default_aux_layers(target_num_hidden_layers)
/// when that is > 0, else stay empty (the config does not name the target's depth). Throws aerie::Error
/// naming the file and tensor on a missing tensor, a wrong shape or dtype, or d2t/t2d that disagree.
ExportedDraft load_export(const std::string& dir, int64_t target_num_hidden_layers = 0);

}  // namespace aerie
