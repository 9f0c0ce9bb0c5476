// Qwen3-MoE (Qwen3-30B-A3B, Qwen3-235B-A22B; transformers' modeling_qwen3_moe.py, vLLM's qwen3_moe.py): Qwen3's
// attention (GQA with q/k norms) on every layer; layer l's FFN is the MoE block unless l is in mlp_only_layers
// or (l + 1) % decoder_sparse_step != 0 (then the dense MLP of intermediate_size). The MoE block: a softmax top-k
// router (gate.weight [num_experts, H], renormalized when norm_topk_prob), routed experts
// mlp.experts.{e}.{gate,up,down}_proj of moe_intermediate_size, no shared expert.
#include "model/arch.h"
#include "model/config_json.h"

namespace aerie {
namespace {

using config_json::optional_bool;
using config_json::optional_int;
using config_json::required_int;

/// Qwen3MoeConfig's MoE fields (transformers 5.17 configuration_qwen3_moe.py defaults: decoder_sparse_step 1,
/// mlp_only_layers [], norm_topk_prob false).
void read_qwen3_moe_config(const nlohmann::json& j, TargetConfig& c, const std::string& path) {
  read_qwen3_config(j, c, path);
  auto& m = c.moe;
  m.router = MoeRouterKind::SoftmaxTopK;
  // The released checkpoints say num_experts; transformers 5 writes it as num_local_experts (its attribute_map).
  const char* experts_key = j.contains("num_experts") || !j.contains("num_local_experts") ? "num_experts"
                                                                                            : "num_local_experts";
  m.n_routed_experts = required_int(j, experts_key, path);
  AERIE_CHECK(m.n_routed_experts >= 0, path << ": " << experts_key << " must be >= 0, got " << m.n_routed_experts);
  m.layers.assign(static_cast<size_t>(c.num_hidden_layers), false);
  if (m.n_routed_experts == 0) return;  // Qwen3MoeDecoderLayer: every layer dense
  m.num_experts_per_tok = required_int(j, "num_experts_per_tok", path);
  m.moe_intermediate_size = required_int(j, "moe_intermediate_size", path);
  m.norm_topk_prob = optional_bool(j, "norm_topk_prob", false, path);
  AERIE_CHECK(m.num_experts_per_tok >= 1 && m.num_experts_per_tok <= m.n_routed_experts,
              path << ": num_experts_per_tok " << m.num_experts_per_tok << " must be in [1, " << experts_key << " = "
                   << m.n_routed_experts << "]");
  AERIE_CHECK(m.moe_intermediate_size >= 1, path << ": moe_intermediate_size must be >= 1");
  const int64_t step = optional_int(j, "decoder_sparse_step", 1, path);
  AERIE_CHECK(step >= 1, path << ": decoder_sparse_step must be >= 1, got " << step);
  std::vector<bool> dense_only(static_cast<size_t>(c.num_hidden_layers), false);
  if (j.contains("mlp_only_layers") && !j["mlp_only_layers"].is_null()) {
    AERIE_CHECK(j["mlp_only_layers"].is_array(), path << ": mlp_only_layers is not a list of layer ids");
    for (const auto& v : j["mlp_only_layers"]) {
      AERIE_CHECK(v.is_number_integer() && v.get<int64_t>() >= 0 && v.get<int64_t>() < c.num_hidden_layers,
                  path << ": mlp_only_layers entry " << v.dump() << " is not a layer id in [0, " << c.num_hidden_layers
                       << ")");
      dense_only[v.get<int64_t>()] = true;
    }
  }
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) m.layers[l] = !dense_only[l] && (l + 1) % step == 0;
}

DecoderLayer build_qwen3_moe_layer(WeightSource& src, const TargetConfig& cfg, int64_t layer) {
  const std::string p = src.decoder_prefix() + "layers." + std::to_string(layer) + ".";
  DecoderLayer L = layer_with_norms(src, p, cfg.hidden_size);
  L.attn = make_gqa_attention(src, gqa_spec(cfg, layer), p + "self_attn.");
  if (cfg.moe.is_moe_layer(layer)) {
    L.ffn = make_moe_ffn(src, moe_spec(cfg), p + "mlp.");
  } else {
    L.ffn = make_dense_ffn(src, {cfg.hidden_size, cfg.intermediate_size, false}, p + "mlp.");
  }
  return L;
}

}  // namespace

Architecture qwen3_moe_architecture() {
  return {"qwen3_moe", "Qwen3-MoE", "GQA (q/k norms)", "MoE (softmax top-k router; dense on mlp_only_layers)", 32768,
          read_qwen3_moe_config, build_qwen3_moe_layer};
}

}  // namespace aerie
