// The weight quantization a Hugging Face checkpoint announces in config.json's quantization_config
// (deepseek-v3.md section 5): DeepSeek-V3 / Kimi-K2's block FP8 and Kimi-K2.5's compressed-tensors
// INT4 groups. Only what aerie dequantizes exactly is accepted; anything else is an error.
#pragma once
#include <nlohmann/json.hpp>
#include <string>

namespace aerie {

struct QuantConfig {
  /// None: no quantization_config (every Linear must be dense); Fp8Block: quant_method "fp8";
  /// Int4Group: quant_method "compressed-tensors", pack-quantized 4-bit groups of 32.
  enum class Method { None, Fp8Block, Int4Group };
  Method method = Method::None;
  std::string path;   // the config.json it was read from (for messages)
  std::string where;  // the field read, as messages name it (quantization_config_source); "" with none
  bool shadows = false;  // text_config holds another quantization_config, not read (quantization_config_source)
};

/// The quantization_config of a config.json object `top` as vLLM picks it
/// (model_executor/model_loader/weight_utils.py, get_quant_config): the top level's quantization_config
/// unless absent or null, else text_config's (a multimodal wrapper that keeps it there), else the top
/// level's compression_config (older compressed-tensors checkpoints). nullptr when there is none.
/// `where` gets the field's name for messages: "quantization_config", "text_config.quantization_config" or
/// "compression_config"; `shadows` whether text_config holds another quantization_config than the top
/// level's one returned (not read, as in vLLM).
const nlohmann::json* quantization_config_source(const nlohmann::json& top, std::string* where = nullptr,
                                                 bool* shadows = nullptr);

/// The quantization of a config.json object `top` as read from quantization_config_source(top) (the
/// file's own object, a wrapper's text_config not merged into it). quant_method is read case-insensitively
/// (vLLM lowercases it). Accepted exactly:
///  - {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128],
///     "activation_scheme": "dynamic" (optional)};
///  - {"quant_method": "compressed-tensors", "format": "pack-quantized", one config_groups entry with
///     "weights": {num_bits 4, type "int", symmetric true, strategy "group", group_size 32, dynamic
///     false, actorder/block_structure null; observer, observer_kwargs: ignored}, "targets": ["Linear"],
///     input/output_activations null; optional "ignore" (a list), "kv_cache_scheme" null,
///     "quantization_status" "compressed", "sparsity_config" null/{}, "global_compression_ratio",
///     "version"}.
/// Which Linears are quantized is read from each tensor's format (compressed-tensors' "ignore" is not
/// interpreted). Throws aerie::Error naming `path` and the field (where it sits: text_config's, the top
/// level's) on another quant_method, a field of another value, or a field not listed.
QuantConfig read_quant_config(const nlohmann::json& top, const std::string& path);

/// "block FP8 (quant_method fp8)", "INT4 (compressed-tensors pack-quantized)" or "no quantization".
std::string describe(QuantConfig::Method m);

}  // namespace aerie
