// The Llama family (transformers' modeling_{llama,mistral,qwen2,qwen3}.py): every layer is GQA attention + the
// dense SwiGLU MLP; the families differ only in the config fields the blocks read:
//   llama    attention_bias -> q/k/v/o biases, mlp_bias -> gate/up/down biases
//   mistral  no biases; sliding_window (null = none) on every layer
//   qwen2    q/k/v biases always, no o bias; sliding window on the layers of layer_types (or, without it,
//            layers >= max_window_layers) when use_sliding_window
//   qwen3    attention_bias -> q/k/v/o biases; q_norm/k_norm; sliding window as qwen2
// Also the Mistral and Qwen3 attention readers, which the MoE families of those attentions reuse.
#include <algorithm>

#include "model/arch.h"
#include "model/config_json.h"

namespace aerie {

using config_json::optional_bool;
using config_json::optional_int;

namespace {

/// Qwen2/Qwen3's sliding window (transformers 5: Qwen2Config, Qwen3Config): sliding_window only when
/// use_sliding_window, on the layers of layer_types, or without it on layers >= max_window_layers.
void read_qwen_sliding_window(const nlohmann::json& j, TargetConfig& c, const std::string& path) {
  const int64_t N = c.num_hidden_layers;
  int64_t w = optional_int(j, "sliding_window", 0, path);
  AERIE_CHECK(w >= 0, path << ": sliding_window must be positive or null, got " << w);
  if (!optional_bool(j, "use_sliding_window", false, path)) w = 0;  // Qwen: sliding_window is then None
  if (w == 0) return;
  if (j.contains("layer_types") && j["layer_types"].is_array()) {
    const auto& lt = j["layer_types"];
    AERIE_CHECK(static_cast<int64_t>(lt.size()) == N,
                path << ": layer_types has " << lt.size() << " entries for " << N << " layers");
    for (int64_t l = 0; l < N; ++l) {
      AERIE_CHECK(lt[l].is_string(), path << ": layer_types[" << l << "] is not a string");
      const std::string t = lt[l].get<std::string>();
      AERIE_CHECK(t == "full_attention" || t == "sliding_attention",
                  path << ": layer_types[" << l << "] \"" << t << "\" is not supported");
      c.sliding_layers[l] = t == "sliding_attention";
    }
  } else {
    const int64_t first = optional_int(j, "max_window_layers", 28, path);
    for (int64_t l = std::max<int64_t>(first, 0); l < N; ++l) c.sliding_layers[l] = true;
  }
  for (bool b : c.sliding_layers)
    if (b) c.sliding_window = w;
}

void read_llama_config(const nlohmann::json& j, TargetConfig& c, const std::string& path) {
  c.qkv_bias = c.o_bias = optional_bool(j, "attention_bias", false, path);
  c.mlp_bias = optional_bool(j, "mlp_bias", false, path);
}

void read_qwen2_config(const nlohmann::json& j, TargetConfig& c, const std::string& path) {
  c.qkv_bias = true;  // hard-wired in Qwen2Attention
  read_qwen_sliding_window(j, c, path);
}

DecoderLayer build_llama_layer(WeightSource& src, const TargetConfig& cfg, int64_t layer) {
  const std::string p = src.decoder_prefix() + "layers." + std::to_string(layer) + ".";
  DecoderLayer L = layer_with_norms(src, p, cfg.hidden_size);
  L.attn = make_gqa_attention(src, gqa_spec(cfg, layer), p + "self_attn.");
  L.ffn = make_dense_ffn(src, {cfg.hidden_size, cfg.intermediate_size, cfg.mlp_bias}, p + "mlp.");
  return L;
}

}  // namespace

void read_mistral_config(const nlohmann::json& j, TargetConfig& c, const std::string& path) {
  const int64_t w = optional_int(j, "sliding_window", 0, path);
  AERIE_CHECK(w >= 0, path << ": sliding_window must be positive or null, got " << w);
  if (w == 0) return;  // every layer; MistralConfig ignores layer_types
  c.sliding_layers.assign(static_cast<size_t>(c.num_hidden_layers), true);
  c.sliding_window = w;
}

void read_qwen3_config(const nlohmann::json& j, TargetConfig& c, const std::string& path) {
  c.qkv_bias = c.o_bias = optional_bool(j, "attention_bias", false, path);
  c.qk_norm = true;
  read_qwen_sliding_window(j, c, path);
}

Architecture llama_architecture() {
  return {"llama", "Llama 2/3.x", "GQA", "dense SwiGLU", 2048, read_llama_config, build_llama_layer};
}
Architecture mistral_architecture() {
  return {"mistral", "Mistral", "GQA (sliding window)", "dense SwiGLU", 131072, read_mistral_config,
          build_llama_layer};
}
Architecture qwen2_architecture() {
  return {"qwen2", "Qwen2/2.5", "GQA (q/k/v biases)", "dense SwiGLU", 32768, read_qwen2_config, build_llama_layer};
}
Architecture qwen3_architecture() {
  return {"qwen3", "Qwen3", "GQA (q/k norms)", "dense SwiGLU", 32768, read_qwen3_config, build_llama_layer};
}

}  // namespace aerie
