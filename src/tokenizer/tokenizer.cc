// Tokenizer::load: reads a Hugging Face tokenizer.json (+ tokenizer_config.json) and picks the
// implementation from the model type and pre-tokenizer. Adding a kind (the byte-level BPE of Llama-3 /
// Qwen) = another class beside SentencePieceBpe and one more branch in make().
#include "tokenizer/tokenizer.h"

#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/log.h"
#include "tokenizer/sentencepiece_bpe.h"

namespace aerie {

namespace {

namespace fs = std::filesystem;

nlohmann::json read_json(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  AERIE_CHECK(f, "cannot open tokenizer file " << path);
  try {
    return nlohmann::json::parse(f);
  } catch (const nlohmann::json::exception& e) {
    AERIE_THROW("bad JSON in " << path << ": " << e.what());
  }
}

// True if the JSON pre-tokenizer (or any member of a Sequence) has type `type`.
bool has_pre_tokenizer(const nlohmann::json& p, const std::string& type) {
  if (!p.is_object()) return false;
  if (p.value("type", "") == type) return true;
  if (p.contains("pretokenizers"))
    for (const auto& s : p["pretokenizers"])
      if (has_pre_tokenizer(s, type)) return true;
  return false;
}

// "bos_token": "<s>" or {"content": "<s>", ...} (AddedToken form); "" when absent or null.
std::string config_token(const nlohmann::json& cfg, const char* key) {
  if (!cfg.contains(key)) return "";
  const auto& v = cfg[key];
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string()) return v["content"].get<std::string>();
  return "";
}

}  // namespace

std::unique_ptr<Tokenizer> Tokenizer::load(const std::string& path) {
  fs::path file = path;
  if (fs::is_directory(file)) file /= "tokenizer.json";
  const std::string fname = file.string();
  AERIE_CHECK(fs::exists(file), "tokenizer file " << fname << " does not exist");
  const nlohmann::json tj = read_json(fname);
  AERIE_CHECK(tj.is_object() && tj.contains("model") && tj["model"].is_object(),
              fname << ": not a Hugging Face tokenizer.json (no \"model\" object)");
  nlohmann::json cfg;
  const fs::path cfg_path = file.parent_path() / "tokenizer_config.json";
  if (fs::exists(cfg_path)) cfg = read_json(cfg_path.string());

  const std::string type = tj["model"].value("type", "");
  const nlohmann::json pre = tj.value("pre_tokenizer", nlohmann::json());
  std::unique_ptr<tok::SentencePieceBpe> t;
  if (type == "BPE" && !has_pre_tokenizer(pre, "ByteLevel")) {
    t = std::make_unique<tok::SentencePieceBpe>(tj, fname);
  } else if (type == "BPE") {
    AERIE_THROW(fname << ": byte-level BPE tokenizers (Llama-3, Qwen) are not implemented yet");
  } else {
    AERIE_THROW(fname << ": tokenizer model type '" << type << "' is not supported (only BPE)");
  }

  // BOS/EOS: tokenizer_config.json's bos_token/eos_token, else "<s>"/"</s>" when in the vocabulary.
  auto special = [&](const char* key, const char* fallback) {
    const std::string name = config_token(cfg, key);
    if (!name.empty()) {
      const int32_t id = t->token_to_id(name);
      AERIE_CHECK(id >= 0, cfg_path.string() << ": " << key << " '" << name << "' is not in " << fname);
      return id;
    }
    if (cfg.is_object() && cfg.contains(key)) return -1;  // explicitly null
    return t->token_to_id(fallback);
  };
  t->set_special_ids(special("bos_token", "<s>"), special("eos_token", "</s>"));
  AERIE_LOG(debug) << "tokenizer " << fname << ": " << type << ", vocab " << t->vocab_size() << ", bos "
                   << t->bos_id() << ", eos " << t->eos_id();
  return t;
}

}  // namespace aerie
