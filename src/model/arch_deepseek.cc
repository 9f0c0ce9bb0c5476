// DeepSeek-V3/R1 and Kimi-K2 / Kimi-K2.5's language model (transformers' modeling_deepseek_v3.py,
// llama.cpp's deepseek2 graph): every layer is MLA attention; layer l's FFN is the MoE block when
// cfg.moe.is_moe_layer(l) (l >= first_k_dense_replace, l % moe_layer_freq == 0), else the dense SwiGLU
// MLP of intermediate_size.
#include <cmath>

#include "model/arch.h"

namespace aerie {

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
    const auto& m = cfg.moe;
    MoeSpec s;
    s.hidden = H;
    s.experts = m.n_routed_experts;
    s.shared_experts = m.n_shared_experts;
    s.moe_intermediate = m.moe_intermediate_size;
    s.n_group = m.n_group;
    s.topk_group = m.topk_group;
    s.top_k = m.num_experts_per_tok;
    s.norm_topk_prob = m.norm_topk_prob;
    s.routed_scaling_factor = static_cast<float>(m.routed_scaling_factor);
    L.ffn = make_moe_ffn(src, s, p + "mlp.");
  } else {
    L.ffn = make_dense_ffn(src, {H, cfg.intermediate_size, false}, p + "mlp.");
  }
  return L;
}

}  // namespace aerie
