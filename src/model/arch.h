// The architecture table: which blocks the decoder layers of a target are built from, keyed on its
// config.json's model_type (llama.cpp's per-architecture graph builders, as a table rather than
// self-registering statics). Adding an architecture: docs/architectures.md.
#pragma once
#include <string>
#include <vector>

#include "model/blocks.h"
#include "model/target_config.h"

namespace aerie {

/// One row of the table.
struct Architecture {
  std::string model_type;  // config.json's model_type (a multimodal wrapper's text_config's)
  std::string family;      // for messages and docs, e.g. "Llama 2/3.x"
  std::string attention;   // the attention block, e.g. "GQA" or "MLA"
  std::string ffn;         // the FFN block(s), e.g. "dense SwiGLU"
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

/// Llama-family layers (llama, mistral, qwen2, qwen3): GQA attention + dense SwiGLU (arch_llama.cc).
DecoderLayer build_llama_layer(WeightSource& src, const TargetConfig& cfg, int64_t layer);
/// DeepSeek-V3-family layers (deepseek_v3, kimi_k2): MLA attention + dense SwiGLU below
/// first_k_dense_replace, MoE above (arch_deepseek.cc).
DecoderLayer build_deepseek_layer(WeightSource& src, const TargetConfig& cfg, int64_t layer);

}  // namespace aerie
