// Mixtral (Mixtral-8x7B, 8x22B; transformers' modeling_mixtral.py, vLLM's mixtral.py): Mistral's attention
// (GQA, sliding_window on every layer when set) and on every layer the MoE block: a softmax top-k router
// (block_sparse_moe.gate.weight [num_local_experts, H], always renormalized) over routed experts
// block_sparse_moe.experts.{e}.w1 (gate), w3 (up), w2 (down) of intermediate_size; no shared expert.
#include "model/arch.h"
#include "model/config_json.h"

namespace aerie {
namespace {

using config_json::optional_int;

/// MixtralConfig's MoE fields (transformers 5.17 configuration_mixtral.py defaults: num_local_experts 8,
/// num_experts_per_tok 2); the experts are intermediate_size wide.
void read_mixtral_config(const nlohmann::json& j, TargetConfig& c, const std::string& path) {
  read_mistral_config(j, c, path);
  auto& m = c.moe;
  m.router = MoeRouterKind::SoftmaxTopK;
  m.n_routed_experts = optional_int(j, "num_local_experts", 8, path);
  m.num_experts_per_tok = optional_int(j, "num_experts_per_tok", 2, path);
  AERIE_CHECK(m.n_routed_experts >= 1 && m.num_experts_per_tok >= 1 && m.num_experts_per_tok <= m.n_routed_experts,
              path << ": num_experts_per_tok " << m.num_experts_per_tok << " must be in [1, num_local_experts = "
                   << m.n_routed_experts << "]");
  m.moe_intermediate_size = c.intermediate_size;
  m.norm_topk_prob = true;  // MixtralTopKRouter renormalizes always
  m.layers.assign(static_cast<size_t>(c.num_hidden_layers), true);
}

DecoderLayer build_mixtral_layer(WeightSource& src, const TargetConfig& cfg, int64_t layer) {
  const std::string p = src.decoder_prefix() + "layers." + std::to_string(layer) + ".";
  DecoderLayer L = layer_with_norms(src, p, cfg.hidden_size);
  L.attn = make_gqa_attention(src, gqa_spec(cfg, layer), p + "self_attn.");
  MoeSpec s = moe_spec(cfg);
  s.gate_proj = "w1";
  s.up_proj = "w3";
  s.down_proj = "w2";
  L.ffn = make_moe_ffn(src, s, p + "block_sparse_moe.");
  return L;
}

}  // namespace

Architecture mixtral_architecture() {
  return {"mixtral", "Mixtral", "GQA (sliding window)", "MoE (softmax top-k router, every layer)", 131072,
          read_mixtral_config, build_mixtral_layer};
}

}  // namespace aerie
