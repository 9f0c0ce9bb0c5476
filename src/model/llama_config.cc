// LlamaConfig from a Hugging Face config.json. Field names and defaults follow transformers'
// LlamaConfig (configuration_llama.py): head_dim = hidden_size / num_attention_heads,
// num_key_value_heads = num_attention_heads, rms_norm_eps = 1e-6, rope_theta = 10000,
// max_position_embeddings = 2048, tie_word_embeddings = false. RoPE parameters are read from
// rope_theta + rope_scaling (transformers 4.x) or from rope_parameters (transformers 5.x).
#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "model/llama_config.h"

namespace aerie {
namespace {

int64_t required_int(const nlohmann::json& j, const char* key, const std::string& path) {
  AERIE_CHECK(j.contains(key) && j[key].is_number_integer(),
              path << ": field \"" << key << "\" is missing or not an integer");
  int64_t v = j[key].get<int64_t>();
  AERIE_CHECK(v > 0, path << ": field \"" << key << "\" must be positive, got " << v);
  return v;
}

int64_t optional_int(const nlohmann::json& j, const char* key, int64_t fallback, const std::string& path) {
  if (!j.contains(key) || j[key].is_null()) return fallback;
  AERIE_CHECK(j[key].is_number_integer(), path << ": field \"" << key << "\" is not an integer");
  return j[key].get<int64_t>();
}

double optional_double(const nlohmann::json& j, const char* key, double fallback, const std::string& path) {
  if (!j.contains(key) || j[key].is_null()) return fallback;
  AERIE_CHECK(j[key].is_number(), path << ": field \"" << key << "\" is not a number");
  return j[key].get<double>();
}

/// bos/eos ids: an integer, a list of integers (the first is taken; the raw list stays in `raw`), or
/// null/absent (-1).
int64_t token_id(const nlohmann::json& j, const char* key, const std::string& path) {
  if (!j.contains(key) || j[key].is_null()) return -1;
  const auto& v = j[key];
  if (v.is_number_integer()) return v.get<int64_t>();
  if (v.is_array()) {
    if (v.empty()) return -1;
    AERIE_CHECK(v[0].is_number_integer(), path << ": field \"" << key << "\"[0] is not an integer");
    return v[0].get<int64_t>();
  }
  AERIE_THROW(path << ": field \"" << key << "\" is neither an integer nor a list of integers");
}

/// RoPE type and llama3 fields from a rope_scaling (4.x) or rope_parameters (5.x) object.
void read_rope_scaling(const nlohmann::json& s, RopeParams& rope, const std::string& path, const char* field) {
  if (s.is_null()) return;
  AERIE_CHECK(s.is_object(), path << ": \"" << field << "\" is not an object");
  std::string type = "default";
  if (s.contains("rope_type") && s["rope_type"].is_string()) type = s["rope_type"].get<std::string>();
  else if (s.contains("type") && s["type"].is_string()) type = s["type"].get<std::string>();
  if (type == "default") return;
  AERIE_CHECK(type == "llama3", path << ": " << field << " type \"" << type
                                     << "\" is not supported (aerie implements \"default\" and \"llama3\")");
  rope.type = "llama3";
  rope.factor = optional_double(s, "factor", rope.factor, path);
  rope.low_freq_factor = optional_double(s, "low_freq_factor", rope.low_freq_factor, path);
  rope.high_freq_factor = optional_double(s, "high_freq_factor", rope.high_freq_factor, path);
  rope.original_max_position_embeddings =
      optional_int(s, "original_max_position_embeddings", rope.original_max_position_embeddings, path);
}

}  // namespace

LlamaConfig load_llama_config(const std::string& dir) {
  std::filesystem::path p = std::filesystem::path(dir) / "config.json";
  const std::string path = p.string();
  std::ifstream in(p);
  AERIE_CHECK(in, "cannot open " << path);
  LlamaConfig c;
  try {
    c.raw = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    AERIE_THROW(path << ": bad JSON: " << e.what());
  }
  const auto& j = c.raw;
  AERIE_CHECK(j.is_object(), path << ": not a JSON object");
  c.hidden_size = required_int(j, "hidden_size", path);
  c.intermediate_size = required_int(j, "intermediate_size", path);
  c.num_hidden_layers = required_int(j, "num_hidden_layers", path);
  c.num_attention_heads = required_int(j, "num_attention_heads", path);
  c.vocab_size = required_int(j, "vocab_size", path);
  c.num_key_value_heads = optional_int(j, "num_key_value_heads", c.num_attention_heads, path);
  AERIE_CHECK(c.num_key_value_heads > 0 && c.num_attention_heads % c.num_key_value_heads == 0,
              path << ": num_attention_heads " << c.num_attention_heads
                   << " is not a multiple of num_key_value_heads " << c.num_key_value_heads);
  c.head_dim = optional_int(j, "head_dim", 0, path);
  if (c.head_dim == 0) {
    AERIE_CHECK(c.hidden_size % c.num_attention_heads == 0,
                path << ": no head_dim and hidden_size " << c.hidden_size << " is not a multiple of "
                     << c.num_attention_heads << " heads");
    c.head_dim = c.hidden_size / c.num_attention_heads;
  }
  AERIE_CHECK(c.head_dim > 0 && c.head_dim % 2 == 0, path << ": head_dim " << c.head_dim << " must be even");
  c.max_position_embeddings = optional_int(j, "max_position_embeddings", 2048, path);
  c.rms_norm_eps = optional_double(j, "rms_norm_eps", 1e-6, path);
  c.tie_word_embeddings = j.contains("tie_word_embeddings") && j["tie_word_embeddings"].is_boolean()
                              ? j["tie_word_embeddings"].get<bool>()
                              : false;
  c.bos_token_id = token_id(j, "bos_token_id", path);
  c.eos_token_id = token_id(j, "eos_token_id", path);

  c.rope = RopeParams{};
  if (j.contains("rope_parameters") && j["rope_parameters"].is_object()) {
    // transformers 5.x: {"rope_type": ..., "rope_theta": ..., llama3 fields}
    c.rope.theta = optional_double(j["rope_parameters"], "rope_theta", c.rope.theta, path);
    read_rope_scaling(j["rope_parameters"], c.rope, path, "rope_parameters");
  } else {
    c.rope.theta = optional_double(j, "rope_theta", c.rope.theta, path);
    if (j.contains("rope_scaling")) read_rope_scaling(j["rope_scaling"], c.rope, path, "rope_scaling");
  }
  AERIE_CHECK(c.rope.theta > 0, path << ": rope_theta must be positive");
  return c;
}

std::vector<int> default_aux_layers(int64_t num_hidden_layers) {
  const int64_t n = num_hidden_layers;
  // vLLM's and SGLang's formula, verbatim: a server given no explicit ids computes exactly this, so the
  // default must not be "corrected". It is ascending from N = 6 on; N = 5 gives (2, 2, 2) (the same
  // residual stream three times, stories260K), N = 3, 4 give (2, 1, 0), (2, 2, 1): valid layer ids,
  // not ascending. Below N = 3 it names layers that do not exist.
  AERIE_CHECK(n >= 3, "default aux layers (2, N/2, N-3) need N >= 3 decoder layers, the model has " << n
                          << "; pass the aux layers explicitly");
  return {2, static_cast<int>(n / 2), static_cast<int>(n - 3)};
}

}  // namespace aerie
