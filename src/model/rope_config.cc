// rope_params_from_config (model/rope_config.h), after transformers' modeling_rope_utils.
#include "model/rope_config.h"

#include "core/error.h"
#include "model/config_json.h"

namespace aerie {

namespace {

using config_json::optional_bool;
using config_json::optional_double;
using config_json::optional_int;

/// RoPE type and its fields from a rope_scaling (4.x) or rope_parameters (5.x) object.
void read_rope_scaling(const nlohmann::json& s, RopeParams& rope, int64_t max_pos, const std::string& path,
                       const char* field) {
  if (s.is_null()) return;
  AERIE_CHECK(s.is_object(), path << ": \"" << field << "\" is not an object");
  std::string type = "default";
  if (s.contains("rope_type") && s["rope_type"].is_string()) type = s["rope_type"].get<std::string>();
  else if (s.contains("type") && s["type"].is_string()) type = s["type"].get<std::string>();
  if (type == "default") return;
  if (type == "linear") {  // position interpolation (Chen et al. 2023): inv_freq / factor
    rope.type = "linear";
    rope.factor = optional_double(s, "factor", 0.0, path);
    AERIE_CHECK(rope.factor > 0, path << ": " << field << " type \"linear\" needs a positive factor");
    return;
  }
  if (type == "yarn") {  // _compute_yarn_parameters (Peng et al. 2023; DeepSeek-V3, Kimi)
    rope.type = "yarn";
    rope.original_max_position_embeddings = optional_int(s, "original_max_position_embeddings", max_pos, path);
    AERIE_CHECK(rope.original_max_position_embeddings > 0,
                path << ": " << field << " type \"yarn\" needs original_max_position_embeddings (or "
                                         "max_position_embeddings) > 0");
    rope.factor = optional_double(s, "factor", 0.0, path);
    if (rope.factor == 0.0)
      rope.factor = static_cast<double>(max_pos) / static_cast<double>(rope.original_max_position_embeddings);
    AERIE_CHECK(rope.factor > 0, path << ": " << field << " type \"yarn\" needs a positive factor");
    rope.beta_fast = optional_double(s, "beta_fast", 0.0, path);
    rope.beta_slow = optional_double(s, "beta_slow", 0.0, path);
    if (rope.beta_fast == 0.0) rope.beta_fast = 32.0;  // transformers: `get("beta_fast") or 32`
    if (rope.beta_slow == 0.0) rope.beta_slow = 1.0;
    rope.mscale = optional_double(s, "mscale", 0.0, path);
    rope.mscale_all_dim = optional_double(s, "mscale_all_dim", 0.0, path);
    rope.attention_factor = optional_double(s, "attention_factor", -1.0, path);
    rope.truncate = optional_bool(s, "truncate", true, path);
    return;
  }
  AERIE_CHECK(type == "llama3", path << ": " << field << " type \"" << type
                                     << "\" is not supported (aerie implements \"default\", \"linear\", \"llama3\" "
                                        "and \"yarn\")");
  rope.type = "llama3";
  rope.factor = optional_double(s, "factor", rope.factor, path);
  rope.low_freq_factor = optional_double(s, "low_freq_factor", rope.low_freq_factor, path);
  rope.high_freq_factor = optional_double(s, "high_freq_factor", rope.high_freq_factor, path);
  rope.original_max_position_embeddings =
      optional_int(s, "original_max_position_embeddings", rope.original_max_position_embeddings, path);
}

}  // namespace

RopeParams rope_params_from_config(const nlohmann::json& j, int64_t max_pos, const std::string& path) {
  RopeParams rope;
  if (j.contains("rope_parameters") && j["rope_parameters"].is_object()) {
    // transformers 5.x: {"rope_type": ..., "rope_theta": ..., the type's fields}
    rope.theta = optional_double(j["rope_parameters"], "rope_theta", rope.theta, path);
    read_rope_scaling(j["rope_parameters"], rope, max_pos, path, "rope_parameters");
  } else {
    rope.theta = optional_double(j, "rope_theta", rope.theta, path);
    if (j.contains("rope_scaling")) read_rope_scaling(j["rope_scaling"], rope, max_pos, path, "rope_scaling");
  }
  AERIE_CHECK(rope.theta > 0, path << ": rope_theta must be positive");
  return rope;
}

nlohmann::json rope_scaling_4x(const nlohmann::json& config) {
  if (!config.is_object()) return nlohmann::json();
  if (config.contains("rope_scaling")) return config["rope_scaling"];
  if (!config.contains("rope_parameters") || !config["rope_parameters"].is_object()) return nlohmann::json();
  nlohmann::json rp = config["rope_parameters"];
  rp.erase("rope_theta");
  const std::string type = rp.value("rope_type", rp.value("type", std::string("default")));
  return type == "default" ? nlohmann::json() : rp;
}

}  // namespace aerie
