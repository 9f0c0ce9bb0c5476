// The Llama family (transformers' modeling_{llama,mistral,qwen2,qwen3}.py): every layer is GQA
// attention + the dense SwiGLU MLP; the families differ only in the config fields the blocks read
// (biases, Qwen3's q/k norms, sliding windows), which load_target_config fills.
#include "model/arch.h"

namespace aerie {

DecoderLayer build_llama_layer(WeightSource& src, const TargetConfig& cfg, int64_t layer) {
  const std::string p = src.decoder_prefix() + "layers." + std::to_string(layer) + ".";
  const int64_t H = cfg.hidden_size;
  DecoderLayer L = layer_with_norms(src, p, H);
  GqaSpec a;
  a.hidden = H;
  a.heads = cfg.num_attention_heads;
  a.kv_heads = cfg.num_key_value_heads;
  a.head_dim = cfg.head_dim;
  a.qkv_bias = cfg.qkv_bias;
  a.o_bias = cfg.o_bias;
  a.qk_norm = cfg.qk_norm;
  a.window = cfg.sliding_layers[layer] ? cfg.sliding_window : 0;
  a.inv_freq = rope_inv_freq(cfg.rope, cfg.head_dim);
  a.eps = static_cast<float>(cfg.rms_norm_eps);
  L.attn = make_gqa_attention(src, a, p + "self_attn.");
  L.ffn = make_dense_ffn(src, {H, cfg.intermediate_size, cfg.mlp_bias}, p + "mlp.");
  return L;
}

}  // namespace aerie
