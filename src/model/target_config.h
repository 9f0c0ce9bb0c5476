// The target model's configuration, read from a Hugging Face config.json (also as the text_config of a
// multimodal wrapper): the fields every family has, and neutral fields (biases, q/k norms, sliding windows,
// MLA, MoE layers and router) that each family's row of the architecture table (model/arch.h, arch_*.cc)
// fills from its own config fields; model_type picks that row.
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "kernels/moe_router.h"
#include "kernels/rope.h"
#include "model/quant_config.h"

namespace aerie {

struct TargetConfig {
  std::string model_type = "llama";  // a built row of model/arch.h (its model_type)
  // A multimodal wrapper's own model_type (Kimi-K2.5's "kimi_k25" around its "kimi_k2" text model), as
  // the serving engines' EAGLE-3 target lists name the target; "" without a wrapper.
  std::string wrapper_model_type;
  int64_t hidden_size = 0, intermediate_size = 0, num_hidden_layers = 0;
  int64_t num_attention_heads = 0, num_key_value_heads = 0, head_dim = 0;
  int64_t vocab_size = 0, max_position_embeddings = 0;
  double rms_norm_eps = 1e-5;
  RopeParams rope;  // rope_params_from_config (model/rope_config.h)
  bool tie_word_embeddings = false;
  // Biases (transformers: Llama/Qwen3 attention_bias -> q, k, v and o; Qwen2 -> q, k, v always;
  // Llama mlp_bias -> gate, up, down).
  bool qkv_bias = false, o_bias = false, mlp_bias = false;
  bool qk_norm = false;  // Qwen3: RMSNorm over head_dim of every q and k head, before RoPE
  // Sliding-window attention: a windowed layer's query at position p attends keys (p - W, p] (W keys,
  // transformers' sliding_window_overlay). 0 = none; layer l is windowed iff sliding_layers[l].
  int64_t sliding_window = 0;
  std::vector<bool> sliding_layers;  // [num_hidden_layers]
  int64_t bos_token_id = -1, eos_token_id = -1;
  // DeepSeek-V3 / Kimi-K2 (the MLA attention of arch.h; transformers' DeepseekV3Config). head_dim is
  // then qk_rope_head_dim, num_key_value_heads num_attention_heads.
  struct Mla {
    int64_t q_lora_rank = 0;  // 0: q_proj [heads (nope + rope), H] instead of q_a/q_b (DeepSeek-V2-Lite)
    int64_t kv_lora_rank = 0, qk_nope_head_dim = 0, qk_rope_head_dim = 0, v_head_dim = 0;
    bool enabled() const { return kv_lora_rank > 0; }
  } mla;
  // Routed experts (the family's reader fills them; n_routed_experts 0: a dense model). Layer l's FFN is the MoE
  // block iff layers[l] (DeepSeek-V3: l >= first_k_dense_replace and l % moe_layer_freq == 0, vLLM's rule;
  // Qwen3-MoE: not in mlp_only_layers and (l + 1) % decoder_sparse_step == 0; Mixtral: every layer); the others
  // use the dense MLP of intermediate_size. router: DeepSeek's sigmoid noaux_tc (groups, e_score_correction_bias,
  // routed_scaling_factor) or softmax top-k (Qwen3-MoE, Mixtral: n_group = topk_group = 1, scaling 1).
  struct Moe {
    MoeRouterKind router = MoeRouterKind::SigmoidNoauxTc;
    int64_t n_routed_experts = 0, n_shared_experts = 0, num_experts_per_tok = 0, moe_intermediate_size = 0;
    int64_t first_k_dense_replace = 0, moe_layer_freq = 1, n_group = 1, topk_group = 1;  // DeepSeek's fields
    bool norm_topk_prob = true;
    double routed_scaling_factor = 1.0;
    std::vector<bool> layers;  // [num_hidden_layers]; empty: no MoE layer
    bool is_moe_layer(int64_t l) const { return l >= 0 && l < static_cast<int64_t>(layers.size()) && layers[l]; }
  } moe;
  // Multi-token-prediction layers stored after the decoder's (DeepSeek-V3's model.layers.61.*): not
  // part of the target's forward; their tensors are skipped on load.
  int64_t num_nextn_predict_layers = 0;
  // quantization_config (read_quant_config): how the checkpoint's Linears may be stored.
  QuantConfig quant;
  // The config.json object the fields were read from; for a multimodal wrapper the top level with its
  // text_config's fields merged over it (rope_scaling, eos_token_id etc. are read from here).
  nlohmann::json raw;
};

/// What marks `config` (a config.json object) as an EAGLE draft's, not a target's: "architecture
/// LlamaForCausalLMEagle3", "field \"draft_vocab_size\"" (aerie's and SpecForge's exports, speculators'
/// checkpoints: draft_vocab_size, eagle_config, speculators_model_type, an architecture containing
/// "Eagle"); "" for a target's config.
std::string eagle_draft_marker(const nlohmann::json& config);

/// Reads "<dir>/config.json" (for a multimodal wrapper without top-level hidden_size, its
/// "text_config"). head_dim defaults to hidden_size / num_attention_heads, num_key_value_heads to
/// num_attention_heads. Throws aerie::Error naming the file and field on a missing/bad field, an
/// unsupported model_type (or one whose blocks are not built yet: find_architecture) or rope type, and
/// on a quantization_config aerie does not dequantize (read_quant_config, model/quant_config.h).
TargetConfig load_target_config(const std::string& dir);

/// load_target_config's parsing of a config.json object already read (`path` names it in messages): the
/// same fields, defaults and errors, for callers that hold the JSON (the memory plan).
TargetConfig target_config_from_json(const nlohmann::json& config, const std::string& path);

/// The default aux layers of eagle3.md section 1: (2, N/2, N-3), vLLM's "input to layer k" convention,
/// verbatim (N = 5 gives (2, 2, 2); below N = 6 the ids are not ascending). Throws aerie::Error if N < 3.
std::vector<int> default_aux_layers(int64_t num_hidden_layers);

}  // namespace aerie
