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
  std::string path;  // the config.json it was read from (for messages)
};

/// The quantization_config of a config.json object `j` (a wrapper's already merged with its
/// text_config, as TargetConfig::raw). Accepted exactly:
///  - {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128],
///     "activation_scheme": "dynamic" (optional)};
///  - {"quant_method": "compressed-tensors", "format": "pack-quantized", one config_groups entry with
///     "weights": {num_bits 4, type "int", symmetric true, strategy "group", group_size 32, dynamic
///     false, actorder/block_structure null; observer, observer_kwargs: ignored}, "targets": ["Linear"],
///     input/output_activations null; optional "ignore" (a list), "kv_cache_scheme" null,
///     "quantization_status" "compressed", "sparsity_config" null/{}, "global_compression_ratio",
///     "version"}.
/// Which Linears are quantized is read from each tensor's format (compressed-tensors' "ignore" is not
/// interpreted). Throws aerie::Error naming `path` and the field on another quant_method, a field of
/// another value, or a field not listed.
QuantConfig read_quant_config(const nlohmann::json& j, const std::string& path);

}  // namespace aerie
