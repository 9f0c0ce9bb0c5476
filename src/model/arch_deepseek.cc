// DeepSeek-V3/R1 and Kimi-K2 / Kimi-K2.5's language model (transformers' modeling_deepseek_v3.py,
// llama.cpp's deepseek2 graph): every layer is MLA attention; layer l's FFN is the MoE block when
// cfg.moe.is_moe_layer(l) (l >= first_k_dense_replace, l % moe_layer_freq == 0), else the dense SwiGLU
// MLP of intermediate_size. The MoE block: DeepSeek's sigmoid noaux_tc router with e_score_correction_bias,
// routed experts mlp.experts.{e}.{gate,up,down}_proj, shared experts.
#include <cmath>

#include "model/arch.h"
#include "model/config_json.h"

namespace aerie {
namespace {

using config_json::optional_bool;
using config_json::optional_double;
using config_json::optional_int;
using config_json::required_int;

/// The MLA and MoE fields of DeepseekV3Config (configuration_deepseek_v3.py), with its checks: the
/// sigmoid noaux_tc router, no attention bias.
void read_deepseek_config(const nlohmann::json& j, TargetConfig& c, const std::string& path) {
  AERIE_CHECK(!optional_bool(j, "attention_bias", false, path),
              path << ": attention_bias true is not supported for " << c.model_type << " (MLA without biases)");
  c.qkv_bias = c.o_bias = c.mlp_bias = false;
  auto& a = c.mla;
  a.q_lora_rank = optional_int(j, "q_lora_rank", 0, path);  // null: plain q_proj
  AERIE_CHECK(a.q_lora_rank >= 0, path << ": q_lora_rank must be positive or null");
  a.kv_lora_rank = required_int(j, "kv_lora_rank", path);
  a.qk_nope_head_dim = required_int(j, "qk_nope_head_dim", path);
  a.qk_rope_head_dim = required_int(j, "qk_rope_head_dim", path);
  a.v_head_dim = required_int(j, "v_head_dim", path);
  AERIE_CHECK(a.qk_rope_head_dim % 2 == 0, path << ": qk_rope_head_dim " << a.qk_rope_head_dim << " must be even");
  AERIE_CHECK(a.v_head_dim <= a.qk_nope_head_dim + a.qk_rope_head_dim,
              path << ": v_head_dim " << a.v_head_dim << " larger than the query/key head dim is not supported");
  c.head_dim = a.qk_rope_head_dim;  // DeepseekV3Config.head_dim: the rotary dimension
  c.num_key_value_heads = c.num_attention_heads;
  auto& m = c.moe;
  m.n_routed_experts = optional_int(j, "n_routed_experts", 0, path);
  if (m.n_routed_experts > 0) {
    m.n_shared_experts = optional_int(j, "n_shared_experts", 0, path);
    m.num_experts_per_tok = required_int(j, "num_experts_per_tok", path);
    m.moe_intermediate_size = required_int(j, "moe_intermediate_size", path);
    m.first_k_dense_replace = optional_int(j, "first_k_dense_replace", 0, path);
    m.moe_layer_freq = optional_int(j, "moe_layer_freq", 1, path);
    m.n_group = optional_int(j, "n_group", 1, path);
    m.topk_group = optional_int(j, "topk_group", 1, path);
    m.norm_topk_prob = optional_bool(j, "norm_topk_prob", true, path);
    m.routed_scaling_factor = optional_double(j, "routed_scaling_factor", 1.0, path);
    AERIE_CHECK(m.moe_layer_freq >= 1 && m.first_k_dense_replace >= 0 && m.n_shared_experts >= 0,
                path << ": moe_layer_freq must be >= 1, first_k_dense_replace and n_shared_experts >= 0");
    AERIE_CHECK(m.n_group >= 1 && m.n_routed_experts % m.n_group == 0 && m.topk_group >= 1 &&
                    m.topk_group <= m.n_group &&
                    m.num_experts_per_tok <= m.topk_group * (m.n_routed_experts / m.n_group),
                path << ": n_routed_experts " << m.n_routed_experts << ", n_group " << m.n_group << ", topk_group "
                     << m.topk_group << ", num_experts_per_tok " << m.num_experts_per_tok << " do not form a router");
    const std::string scoring = config_json::optional_string(j, "scoring_func", "sigmoid", path);
    const std::string method = config_json::optional_string(j, "topk_method", "noaux_tc", path);
    AERIE_CHECK(scoring == "sigmoid" && method == "noaux_tc",
                path << ": scoring_func \"" << scoring << "\" / topk_method \"" << method
                     << "\" is not supported (DeepSeek-V3's sigmoid / noaux_tc router)");
  }
  c.num_nextn_predict_layers = optional_int(j, "num_nextn_predict_layers", 0, path);
  m.router = MoeRouterKind::SigmoidNoauxTc;
  m.layers.assign(static_cast<size_t>(c.num_hidden_layers), false);
  for (int64_t l = 0; l < c.num_hidden_layers; ++l)  // vLLM's rule (deepseek_v2.py)
    m.layers[l] = m.n_routed_experts > 0 && l >= m.first_k_dense_replace && l % m.moe_layer_freq == 0;
}

DecoderLayer build_deepseek_layer(WeightSource& src, const TargetConfig& cfg, int64_t layer) {
  const std::string p = src.decoder_prefix() + "layers." + std::to_string(layer) + ".";
  const int64_t H = cfg.hidden_size;
  DecoderLayer L = layer_with_norms(src, p, H);
  MlaSpec a;
  a.hidden = H;
  a.heads = cfg.num_attention_heads;
  a.q_lora_rank = cfg.mla.q_lora_rank;
  a.kv_lora_rank = cfg.mla.kv_lora_rank;
  a.qk_nope = cfg.mla.qk_nope_head_dim;
  a.qk_rope = cfg.mla.qk_rope_head_dim;
  a.v_head = cfg.mla.v_head_dim;
  a.inv_freq = rope_inv_freq(cfg.rope, a.qk_rope);
  a.rope_scale = static_cast<float>(rope_attention_factor(cfg.rope));
  a.softmax_scale = static_cast<float>(mla_softmax_scale(cfg.rope, a.qk_nope + a.qk_rope));
  a.eps = static_cast<float>(cfg.rms_norm_eps);
  L.attn = make_mla_attention(src, a, p + "self_attn.");
  if (cfg.moe.is_moe_layer(layer)) {
    L.ffn = make_moe_ffn(src, moe_spec(cfg), p + "mlp.");
  } else {
    L.ffn = make_dense_ffn(src, {H, cfg.intermediate_size, false}, p + "mlp.");
  }
  return L;
}

}  // namespace

// DeepSeek-V3 and the Kimi targets: DeepseekV3ForCausalLM; Kimi-K2.5 wraps it as text_config, whose model_type is
// deepseek_v3 (or kimi_k2 in other copies). ../shared/docs/deepseek-v3.md.
Architecture deepseek_v3_architecture() {
  return {"deepseek_v3", "DeepSeek-V3/R1, Kimi-K2.5's language model", "MLA",
          "MoE (sigmoid router, shared experts; dense below first_k_dense_replace)", 4096, read_deepseek_config,
          build_deepseek_layer};
}
Architecture kimi_k2_architecture() {
  return {"kimi_k2", "Kimi-K2", "MLA", "MoE (sigmoid router, shared experts; dense below first_k_dense_replace)", 4096,
          read_deepseek_config, build_deepseek_layer};
}

}  // namespace aerie
