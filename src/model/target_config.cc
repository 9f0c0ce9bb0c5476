// TargetConfig from a Hugging Face config.json. Field names and defaults follow transformers'
// LlamaConfig (configuration_llama.py): head_dim = hidden_size / num_attention_heads,
// num_key_value_heads = num_attention_heads, rms_norm_eps = 1e-6, rope_theta = 10000,
// max_position_embeddings = the model_type config class's default (below), tie_word_embeddings = false. RoPE parameters are read from
// rope_theta + rope_scaling (transformers 4.x) or from rope_parameters (transformers 5.x).
// Per family (transformers' modeling_{llama,mistral,qwen2,qwen3}.py):
//   llama    attention_bias -> q/k/v/o biases, mlp_bias -> gate/up/down biases
//   mistral  no biases; sliding_window (null = none) on every layer
//   qwen2    q/k/v biases always, no o bias; sliding window on the layers of layer_types (or, without
//            it, layers >= max_window_layers when use_sliding_window)
//   qwen3    attention_bias -> q/k/v/o biases; q_norm/k_norm; sliding window as qwen2
#include <algorithm>
#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "core/memory.h"
#include "model/arch.h"
#include "model/config_json.h"
#include "model/rope_config.h"
#include "model/target_config.h"

namespace aerie {
namespace {

using config_json::optional_bool;
using config_json::optional_double;
using config_json::optional_int;
using config_json::required_int;

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


/// A size field of `path` against the memory it makes aerie allocate before any weight is read (a
/// config.json of 10^12 layers ended extract and plan in std::bad_alloc naming nothing): `value` items of
/// `bytes_each` bytes (`what`) must fit the memory this machine has available. Throws aerie::Error naming the
/// field and the file, also for a value below 1.
void check_size_field(const std::string& path, const char* field, int64_t value, double bytes_each, const char* what) {
  AERIE_CHECK(value >= 1, path << ": " << field << " must be at least 1, got " << value);
  const int64_t have = host_memory_bytes();
  const double need = static_cast<double>(value) * bytes_each;
  AERIE_CHECK(have <= 0 || need <= static_cast<double>(have),
              path << ": " << field << " " << value << " needs " << gib_text(need) << " for " << what << ", more than the "
                   << gib_text(static_cast<double>(have)) << " of memory this machine has available: is " << field
                   << " right?");
}

/// sliding_window and sliding_layers as transformers 5 reads them (Mistral-, Qwen2- and Qwen3Config).
void read_sliding_window(const nlohmann::json& j, TargetConfig& c, const std::string& path) {
  const int64_t N = c.num_hidden_layers;
  c.sliding_layers.assign(static_cast<size_t>(N), false);
  if (c.model_type == "llama") return;  // TargetConfig has no sliding window
  int64_t w = optional_int(j, "sliding_window", 0, path);
  AERIE_CHECK(w >= 0, path << ": sliding_window must be positive or null, got " << w);
  if (c.model_type == "mistral") {  // every layer; MistralConfig ignores layer_types
    if (w > 0) c.sliding_layers.assign(static_cast<size_t>(N), true);
  } else {
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
  }
  for (bool b : c.sliding_layers)
    if (b) c.sliding_window = w;
}

/// The MLA and MoE fields of DeepseekV3Config (configuration_deepseek_v3.py), with its checks: the
/// sigmoid noaux_tc router, no attention bias.
void read_deepseek(const nlohmann::json& j, TargetConfig& c, const std::string& path) {
  AERIE_CHECK(!optional_bool(j, "attention_bias", false, path),
              path << ": attention_bias true is not supported for " << c.model_type << " (MLA without biases)");
  c.qkv_bias = c.o_bias = c.mlp_bias = false;
  auto& a = c.mla;
  a.q_lora_rank = optional_int(j, "q_lora_rank", 0, path);  // null: plain q_proj
  AERIE_CHECK(a.q_lora_rank >= 0, path << ": q_lora_rank must be positive or null");
  a.kv_lora_rank = required_int(j, "kv_lora_rank", path);
  a.qk_nope_head_dim = required_int(j, "qk_nope_head_dim", path);
  a.qk_rope_head_dim = required_int(j, "qk_rope_head_dim", path);
  a.v_head_dim = required_int(j, "v_head_dim", path);
  AERIE_CHECK(a.qk_rope_head_dim % 2 == 0, path << ": qk_rope_head_dim " << a.qk_rope_head_dim << " must be even");
  AERIE_CHECK(a.v_head_dim <= a.qk_nope_head_dim + a.qk_rope_head_dim,
              path << ": v_head_dim " << a.v_head_dim << " larger than the query/key head dim is not supported");
  c.head_dim = a.qk_rope_head_dim;  // DeepseekV3Config.head_dim: the rotary dimension
  c.num_key_value_heads = c.num_attention_heads;
  auto& m = c.moe;
  m.n_routed_experts = optional_int(j, "n_routed_experts", 0, path);
  if (m.n_routed_experts > 0) {
    m.n_shared_experts = optional_int(j, "n_shared_experts", 0, path);
    m.num_experts_per_tok = required_int(j, "num_experts_per_tok", path);
    m.moe_intermediate_size = required_int(j, "moe_intermediate_size", path);
    m.first_k_dense_replace = optional_int(j, "first_k_dense_replace", 0, path);
    m.moe_layer_freq = optional_int(j, "moe_layer_freq", 1, path);
    m.n_group = optional_int(j, "n_group", 1, path);
    m.topk_group = optional_int(j, "topk_group", 1, path);
    m.norm_topk_prob = optional_bool(j, "norm_topk_prob", true, path);
    m.routed_scaling_factor = optional_double(j, "routed_scaling_factor", 1.0, path);
    AERIE_CHECK(m.moe_layer_freq >= 1 && m.first_k_dense_replace >= 0 && m.n_shared_experts >= 0,
                path << ": moe_layer_freq must be >= 1, first_k_dense_replace and n_shared_experts >= 0");
    AERIE_CHECK(m.n_group >= 1 && m.n_routed_experts % m.n_group == 0 && m.topk_group >= 1 &&
                    m.topk_group <= m.n_group &&
                    m.num_experts_per_tok <= m.topk_group * (m.n_routed_experts / m.n_group),
                path << ": n_routed_experts " << m.n_routed_experts << ", n_group " << m.n_group << ", topk_group "
                     << m.topk_group << ", num_experts_per_tok " << m.num_experts_per_tok << " do not form a router");
    const std::string scoring = config_json::optional_string(j, "scoring_func", "sigmoid", path);
    const std::string method = config_json::optional_string(j, "topk_method", "noaux_tc", path);
    AERIE_CHECK(scoring == "sigmoid" && method == "noaux_tc",
                path << ": scoring_func \"" << scoring << "\" / topk_method \"" << method
                     << "\" is not supported (DeepSeek-V3's sigmoid / noaux_tc router)");
  }
  c.num_nextn_predict_layers = optional_int(j, "num_nextn_predict_layers", 0, path);
}

}  // namespace

std::string eagle_draft_marker(const nlohmann::json& config) {
  std::string draft;
  if (!config.is_object()) return draft;
  for (const char* key : {"draft_vocab_size", "eagle_config", "speculators_model_type"})
    if (config.contains(key)) draft = std::string("field \"") + key + "\"";
  if (config.contains("architectures") && config["architectures"].is_array())
    for (const auto& a : config["architectures"])
      if (a.is_string() && a.get<std::string>().find("Eagle") != std::string::npos)
        draft = "architecture " + a.get<std::string>();
  return draft;
}

TargetConfig load_target_config(const std::string& dir) {
  std::error_code ec;
  const bool exists = std::filesystem::exists(dir, ec);
  AERIE_CHECK(!ec, "model folder " << dir << ": " << ec.message());  // a symlink loop, a permission
  AERIE_CHECK(exists, "model folder " << dir << " does not exist");
  AERIE_CHECK(std::filesystem::is_directory(dir, ec),
              dir << " is not a folder (a model is a Hugging Face folder: config.json, model.safetensors, tokenizer)");
  std::filesystem::path p = std::filesystem::path(dir) / "config.json";
  const std::string path = p.string();
  if (!std::filesystem::exists(p, ec)) {  // one of aerie's own folders given where the target belongs
    const auto has = [&](const char* name) { return std::filesystem::exists(std::filesystem::path(dir) / name, ec); };
    bool shards = false;
    for (const auto& e : std::filesystem::directory_iterator(dir, ec))
      shards = shards || e.path().filename().string().rfind("shard-", 0) == 0;
    AERIE_CHECK(!shards, dir << " holds hidden-state shards (an extract folder), not a target model: give the "
                                "model's Hugging Face folder (config.json, model.safetensors, tokenizer)");
    AERIE_CHECK(!has("checkpoints"), dir << " is a training run folder of aerie train, not a target model: give the "
                                            "model's Hugging Face folder (config.json, model.safetensors, tokenizer)");
  }
  std::ifstream in(p);
  AERIE_CHECK(in, "cannot open " << path << " (a model folder holds the Hugging Face config.json)");
  nlohmann::json raw;
  try {
    raw = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    AERIE_THROW(path << ": bad JSON: " << e.what());
  }
  AERIE_CHECK(raw.is_object(), path << ": not a JSON object");
  AERIE_CHECK(!(raw.contains("draft") && raw.contains("train")),
              dir << " is a training checkpoint of aerie train (its config.json holds the draft's and the run's "
                     "settings), not a target model: give the model's Hugging Face folder (config.json, "
                     "model.safetensors, tokenizer)");
  return target_config_from_json(raw, path);
}

TargetConfig target_config_from_json(const nlohmann::json& config, const std::string& path) {
  TargetConfig c;
  c.raw = config;
  AERIE_CHECK(c.raw.is_object(), path << ": not a JSON object");
  {  // An EAGLE draft (aerie's export, SpecForge's or speculators' checkpoint) given where the target belongs.
    const std::string draft = eagle_draft_marker(c.raw);
    AERIE_CHECK(draft.empty(), path << ": an EAGLE draft's config (" << draft
                                    << "), not a target model's: give the target's folder here (a draft export "
                                       "goes to eval's --draft)");
  }
  const nlohmann::json file_object = c.raw;  // before a wrapper's text_config is merged in
  if (!c.raw.contains("hidden_size") && c.raw.contains("text_config") && c.raw["text_config"].is_object()) {
    // A multimodal wrapper (Llava, Mistral3, ...): the language model's fields are its text_config.
    nlohmann::json merged = c.raw, text = c.raw["text_config"];
    merged.erase("text_config");
    if (merged.contains("model_type") && merged["model_type"].is_string())
      c.wrapper_model_type = merged["model_type"].get<std::string>();
    merged.erase("model_type");  // the wrapper's ("llava"): the text model's type or none
    for (auto& [k, v] : text.items()) merged[k] = v;
    c.raw = std::move(merged);
  }
  const auto& j = c.raw;
  if (j.contains("model_type") && !j["model_type"].is_null()) {
    AERIE_CHECK(j["model_type"].is_string(), path << ": field \"model_type\" is not a string");
    c.model_type = j["model_type"].get<std::string>();
  }
  find_architecture(c.model_type, path);  // throws for an unknown or not yet built architecture
  c.hidden_size = required_int(j, "hidden_size", path);
  c.intermediate_size = required_int(j, "intermediate_size", path);
  c.num_hidden_layers = required_int(j, "num_hidden_layers", path);
  c.num_attention_heads = required_int(j, "num_attention_heads", path);
  c.vocab_size = required_int(j, "vocab_size", path);
  // Before the per-layer tables below (and the model's layers, the plan's rows) are allocated: aerie keeps a
  // few KiB a layer besides its weights, and 8 bytes a token id (token counts, the draft's t2d).
  check_size_field(path, "num_hidden_layers", c.num_hidden_layers, 4096, "aerie's per-layer state (4 KiB a layer)");
  check_size_field(path, "vocab_size", c.vocab_size, 64, "the tables of token ids (64 bytes an id)");
  check_size_field(path, "hidden_size", c.hidden_size, 1, "the hidden states");
  check_size_field(path, "intermediate_size", c.intermediate_size, 1, "the MLP");
  check_size_field(path, "num_attention_heads", c.num_attention_heads, 1, "the attention heads");
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
  // Absent: transformers' default of the model_type's config class (5.24: LlamaConfig 2048,
  // MistralConfig 131072, Qwen2Config / Qwen3Config 32768, DeepseekV3Config 4096), which is what a
  // serving engine reading the same config.json assumes.
  const int64_t default_positions = c.model_type == "mistral"                              ? 131072
                                    : c.model_type == "qwen2" || c.model_type == "qwen3" ? 32768
                                    : c.model_type == "deepseek_v3" || c.model_type == "kimi_k2" ? 4096
                                                                                          : 2048;
  c.max_position_embeddings = optional_int(j, "max_position_embeddings", default_positions, path);
  c.rms_norm_eps = optional_double(j, "rms_norm_eps", 1e-6, path);
  c.tie_word_embeddings = j.contains("tie_word_embeddings") && j["tie_word_embeddings"].is_boolean()
                              ? j["tie_word_embeddings"].get<bool>()
                              : false;
  if (j.contains("hidden_act") && !j["hidden_act"].is_null()) {
    AERIE_CHECK(j["hidden_act"] == "silu", path << ": hidden_act " << j["hidden_act"].dump()
                                                << " is not supported (the MLP is SwiGLU: silu)");
  }
  if (c.model_type == "qwen2") {
    c.qkv_bias = true;  // hard-wired in Qwen2Attention
  } else if (c.model_type == "llama" || c.model_type == "qwen3") {
    c.qkv_bias = c.o_bias = optional_bool(j, "attention_bias", false, path);
  }
  c.mlp_bias = c.model_type == "llama" && optional_bool(j, "mlp_bias", false, path);
  c.qk_norm = c.model_type == "qwen3";
  read_sliding_window(j, c, path);
  if (c.model_type == "deepseek_v3" || c.model_type == "kimi_k2") read_deepseek(j, c, path);
  c.bos_token_id = token_id(j, "bos_token_id", path);
  c.eos_token_id = token_id(j, "eos_token_id", path);

  c.rope = rope_params_from_config(j, c.max_position_embeddings, path);
  // The quantization as vLLM picks it from the file's own object (a wrapper's top level first).
  c.quant = read_quant_config(file_object, path);
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
