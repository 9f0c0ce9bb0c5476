// The architecture table: how a target's config.json is read and which blocks its decoder layers are built
// from, keyed on its model_type (llama.cpp's per-architecture files, as a table rather than self-registering
// statics). Adding an architecture: one arch_*.cc file and its row in arch.cc (docs/architectures.md).
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "model/blocks.h"
#include "model/target_config.h"

namespace aerie {

/// One row of the table: everything aerie knows of one family, from its config.json fields to its layers
/// (llama.cpp's load_arch_hparams beside its graph). A row lives in its arch_*.cc file, which defines the
/// function that returns it; the table (arch.cc) lists those functions.
struct Architecture {
  std::string model_type;  // config.json's model_type (a multimodal wrapper's text_config's)
  std::string family;      // for messages and docs, e.g. "Llama 2/3.x"
  std::string attention;   // the attention block, e.g. "GQA" or "MLA"
  std::string ffn;         // the FFN block(s), e.g. "dense SwiGLU"
  /// max_position_embeddings when config.json has none: the transformers config class's default, which is
  /// what a serving engine reading the same file assumes.
  int64_t default_max_positions = 2048;
  /// Reads the family's own fields of config.json `j` (`path` names it in messages) into `c`, whose common
  /// fields (sizes, heads, head_dim, vocab, eps, max positions) are already read and whose sliding_layers are
  /// all false: biases, q/k norms, sliding windows, MLA and MoE fields (c.moe.layers, c.moe.router). Throws
  /// aerie::Error naming the file and field.
  void (*read_config)(const nlohmann::json& j, TargetConfig& c, const std::string& path) = nullptr;
  /// Builds decoder layer `layer` from `src` (Hugging Face names under src.decoder_prefix()), this tp
  /// rank's part. Null: the architecture is recognised but its blocks are not built yet.
  DecoderLayer (*build_layer)(WeightSource& src, const TargetConfig& cfg, int64_t layer) = nullptr;
};

/// Every architecture aerie knows, built or not, in table order.
const std::vector<Architecture>& architectures();

/// The row of `model_type`. Throws aerie::Error, naming `where` (the config file) and listing the
/// supported types, when it is unknown, or when it is known but not built yet (naming its blocks).
const Architecture& find_architecture(const std::string& model_type, const std::string& where);

/// A pre-norm layer's two RMSNorm weights, `prefix` {input,post_attention}_layernorm.weight [hidden] F32.
DecoderLayer layer_with_norms(WeightSource& src, const std::string& prefix, int64_t hidden);

// Pieces the arch files share (gqa_spec, moe_spec: arch.cc; the two readers: arch_llama.cc).

/// The GQA attention spec of decoder layer `layer` from the config's fields (heads, head_dim, biases, q/k
/// norms, the layer's sliding window, RoPE).
GqaSpec gqa_spec(const TargetConfig& cfg, int64_t layer);
/// Mistral's attention fields (MistralConfig): no biases; sliding_window (null = none) on every layer.
void read_mistral_config(const nlohmann::json& j, TargetConfig& c, const std::string& path);
/// Qwen3's attention fields (Qwen3Config): attention_bias -> q/k/v/o biases, q/k norms, sliding window on the
/// layers of layer_types (or, without it, layers >= max_window_layers) when use_sliding_window.
void read_qwen3_config(const nlohmann::json& j, TargetConfig& c, const std::string& path);
/// A routed-experts FFN spec of the config's MoE fields (router, experts, top-k, intermediate size, groups,
/// scaling); the expert tensor names are the family's to set.
MoeSpec moe_spec(const TargetConfig& cfg);

}  // namespace aerie
