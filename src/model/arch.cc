// The architecture table (model/arch.h).
#include "model/arch.h"

#include <sstream>

#include "core/error.h"

namespace aerie {

// The rows, each defined beside its family's config reader and layer builder.
Architecture llama_architecture();        // arch_llama.cc
Architecture mistral_architecture();      // arch_llama.cc
Architecture qwen2_architecture();        // arch_llama.cc
Architecture qwen3_architecture();        // arch_llama.cc
Architecture deepseek_v3_architecture();  // arch_deepseek.cc
Architecture kimi_k2_architecture();      // arch_deepseek.cc
Architecture qwen3_moe_architecture();    // arch_qwen3_moe.cc
Architecture mixtral_architecture();      // arch_mixtral.cc

const std::vector<Architecture>& architectures() {
  static const std::vector<Architecture> table = {
      llama_architecture(),       mistral_architecture(),  qwen2_architecture(), qwen3_architecture(),
      deepseek_v3_architecture(), kimi_k2_architecture(),  qwen3_moe_architecture(), mixtral_architecture(),
  };
  return table;
}

const Architecture& find_architecture(const std::string& model_type, const std::string& where) {
  std::ostringstream built;
  for (const Architecture& a : architectures()) {
    if (a.build_layer) built << (built.tellp() > 0 ? ", " : "") << a.model_type;
  }
  for (const Architecture& a : architectures()) {
    if (a.model_type != model_type) continue;
    AERIE_CHECK(a.build_layer, where << ": model_type \"" << model_type << "\" (" << a.family << ": " << a.attention
                                     << " attention, " << a.ffn << ") is recognised, but aerie does not build its "
                                     << "blocks yet; supported: " << built.str());
    return a;
  }
  AERIE_THROW(where << ": model_type \"" << model_type << "\" is not supported (" << built.str() << ")");
}

DecoderLayer layer_with_norms(WeightSource& src, const std::string& prefix, int64_t hidden) {
  DecoderLayer L;
  L.input_norm = src.load(prefix + "input_layernorm.weight", {hidden}, TpSplit::None, ParamRole::Norm);
  L.post_norm = src.load(prefix + "post_attention_layernorm.weight", {hidden}, TpSplit::None, ParamRole::Norm);
  return L;
}

GqaSpec gqa_spec(const TargetConfig& cfg, int64_t layer) {
  GqaSpec a;
  a.hidden = cfg.hidden_size;
  a.heads = cfg.num_attention_heads;
  a.kv_heads = cfg.num_key_value_heads;
  a.head_dim = cfg.head_dim;
  a.qkv_bias = cfg.qkv_bias;
  a.o_bias = cfg.o_bias;
  a.qk_norm = cfg.qk_norm;
  a.window = cfg.sliding_layers[layer] ? cfg.sliding_window : 0;
  a.inv_freq = rope_inv_freq(cfg.rope, cfg.head_dim);
  a.eps = static_cast<float>(cfg.rms_norm_eps);
  return a;
}

MoeSpec moe_spec(const TargetConfig& cfg) {
  const auto& m = cfg.moe;
  MoeSpec s;
  s.hidden = cfg.hidden_size;
  s.router = m.router;
  s.experts = m.n_routed_experts;
  s.shared_experts = m.n_shared_experts;
  s.moe_intermediate = m.moe_intermediate_size;
  s.n_group = m.n_group;
  s.topk_group = m.topk_group;
  s.top_k = m.num_experts_per_tok;
  s.norm_topk_prob = m.norm_topk_prob;
  s.routed_scaling_factor = static_cast<float>(m.routed_scaling_factor);
  return s;
}

}  // namespace aerie
