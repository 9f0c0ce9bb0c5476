// Tokenizer::load: reads a Hugging Face tokenizer.json (+ tokenizer_config.json) and picks the
// implementation from the model type and pre-tokenizer: BPE with a ByteLevel pre-tokenizer is
// ByteLevelBpe (GPT-2, Llama-3, Qwen, DeepSeek-V3), any other BPE SentencePieceBpe (Llama-2, Mistral); or
// a tiktoken folder (Kimi-K2: tiktoken.model + tokenizer_config.json, tokenizer/tiktoken.h).
#include "tokenizer/tokenizer.h"

#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/log.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/sentencepiece_bpe.h"
#include "tokenizer/tiktoken.h"

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

// BOS/EOS: tokenizer_config.json's bos_token/eos_token, else `bos_fallback` / "</s>" when in the
// vocabulary (an explicit null in the config means none).
template <class T>
void set_special_ids(T& t, const nlohmann::json& cfg, const std::string& cfg_path, const std::string& fname,
                     int32_t bos_fallback) {
  auto special = [&](const char* key, int32_t fallback) {
    const std::string name = config_token(cfg, key);
    if (!name.empty()) {
      const int32_t id = t.token_to_id(name);
      AERIE_CHECK(id >= 0, cfg_path << ": " << key << " '" << name << "' is not in " << fname);
      return id;
    }
    if (cfg.is_object() && cfg.contains(key)) return -1;  // explicitly null
    return fallback;
  };
  t.set_special_ids(special("bos_token", bos_fallback), special("eos_token", t.token_to_id("</s>")));
}

}  // namespace

Encoding Tokenizer::encode_with_offsets(const std::string& text) const {
  AERIE_THROW("this tokenizer does not track byte offsets (encode_with_offsets)");
}

std::unique_ptr<Tokenizer> Tokenizer::load(const std::string& path) {
  fs::path file = path;
  // A tiktoken folder (Kimi-K2): tiktoken.model and no tokenizer.json, or the tiktoken.model itself.
  const fs::path tiktoken_dir = fs::is_directory(file) ? file : file.filename() == "tiktoken.model" ? file.parent_path() : "";
  if (!tiktoken_dir.empty() && fs::exists(tiktoken_dir / "tiktoken.model") &&
      (file.filename() == "tiktoken.model" || !fs::exists(tiktoken_dir / "tokenizer.json"))) {
    auto tt = tok::load_tiktoken_folder(tiktoken_dir.string());
    const fs::path cfg_path = tiktoken_dir / "tokenizer_config.json";
    nlohmann::json cfg;
    if (fs::exists(cfg_path)) cfg = read_json(cfg_path.string());
    set_special_ids(*tt, cfg, cfg_path.string(), (tiktoken_dir / "tiktoken.model").string(), -1);
    AERIE_LOG(debug) << "tokenizer " << tiktoken_dir.string() << ": tiktoken, vocab " << tt->vocab_size()
                     << ", bos " << tt->bos_id() << ", eos " << tt->eos_id();
    return tt;
  }
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
  std::unique_ptr<Tokenizer> t;
  if (type == "BPE" && !has_pre_tokenizer(pre, "ByteLevel")) {
    auto sp = std::make_unique<tok::SentencePieceBpe>(tj, fname);
    set_special_ids(*sp, cfg, cfg_path.string(), fname, sp->token_to_id("<s>"));
    t = std::move(sp);
  } else if (type == "BPE") {
    auto bl = std::make_unique<tok::ByteLevelBpe>(tj, fname);
    // BOS: the config's bos_token, else the special token TemplateProcessing puts first (Llama-3).
    const int32_t tmpl = bl->template_prefix().empty() ? -1 : bl->template_prefix().front();
    set_special_ids(*bl, cfg, cfg_path.string(), fname, tmpl >= 0 ? tmpl : bl->token_to_id("<s>"));
    if (tmpl >= 0 && bl->bos_id() != tmpl)
      AERIE_LOG(warning) << fname << ": the post_processor starts with token " << tmpl << " but BOS is "
                         << bl->bos_id() << " (" << cfg_path.string() << ")";
    t = std::move(bl);
  } else {
    AERIE_THROW(fname << ": tokenizer model type '" << type << "' is not supported (only BPE)");
  }
  AERIE_LOG(debug) << "tokenizer " << fname << ": " << type << ", vocab " << t->vocab_size() << ", bos "
                   << t->bos_id() << ", eos " << t->eos_id();
  return t;
}

}  // namespace aerie
