// TargetConfig from a Hugging Face config.json: the fields every family has, here, with transformers'
// LlamaConfig defaults (configuration_llama.py): head_dim = hidden_size / num_attention_heads,
// num_key_value_heads = num_attention_heads, rms_norm_eps = 1e-6, rope_theta = 10000, tie_word_embeddings =
// false; max_position_embeddings defaults per family. RoPE parameters are read from rope_theta + rope_scaling
// (transformers 4.x) or from rope_parameters (transformers 5.x). Each family's own fields (biases, q/k norms,
// sliding windows, MLA, MoE) are read by its row of the architecture table (model/arch_*.cc).
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
  // Throws for an unknown or not yet built architecture.
  const Architecture& arch = find_architecture(c.model_type, path);
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
  // Absent: transformers' default of the model_type's config class (Architecture::default_max_positions).
  c.max_position_embeddings = optional_int(j, "max_position_embeddings", arch.default_max_positions, path);
  c.rms_norm_eps = optional_double(j, "rms_norm_eps", 1e-6, path);
  c.tie_word_embeddings = j.contains("tie_word_embeddings") && j["tie_word_embeddings"].is_boolean()
                              ? j["tie_word_embeddings"].get<bool>()
                              : false;
  if (j.contains("hidden_act") && !j["hidden_act"].is_null()) {
    AERIE_CHECK(j["hidden_act"] == "silu", path << ": hidden_act " << j["hidden_act"].dump()
                                                << " is not supported (the MLP is SwiGLU: silu)");
  }
  c.sliding_layers.assign(static_cast<size_t>(c.num_hidden_layers), false);
  arch.read_config(j, c, path);  // the family's own fields (model/arch_*.cc)
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
