// The RoPE parameters of a config.json, one parser for the target, the draft and the export.
#pragma once
#include <nlohmann/json.hpp>
#include <string>

#include "kernels/rope.h"

namespace aerie {

/// RopeParams from a config object: transformers 5.x's rope_parameters {rope_type, rope_theta, ...} or
/// 4.x's rope_theta + rope_scaling {type|rope_type, ...}. Types "default", "linear" (factor), "llama3"
/// (factor, low/high_freq_factor, original_max_position_embeddings) and "yarn" (factor, defaulting to
/// max_position_embeddings / original_max_position_embeddings as transformers does; beta_fast 32 and
/// beta_slow 1 by default, also when 0 or null; mscale, mscale_all_dim, attention_factor, truncate).
/// `max_position_embeddings` is the config's (yarn's original length defaults to it). Throws
/// aerie::Error naming `path` and the field on a bad field, an unsupported type or rope_theta <= 0.
RopeParams rope_params_from_config(const nlohmann::json& config, int64_t max_position_embeddings,
                                   const std::string& path);

/// The rope scaling of a config in the transformers 4.x spelling that vLLM and SGLang read: its
/// rope_scaling as written; else (5.x) its rope_parameters object without rope_theta, null for the
/// "default" type; null when the config has neither. rope_params_from_config reads the result (with
/// the config's rope_theta) as the same RopeParams.
nlohmann::json rope_scaling_4x(const nlohmann::json& config);

}  // namespace aerie
