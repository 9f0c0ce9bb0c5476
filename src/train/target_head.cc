#include "train/target_head.h"

#include <filesystem>
#include <fstream>
#include <map>

#include <nlohmann/json.hpp>

#include "io/safetensors.h"

namespace aerie {

namespace {

// File (relative to dir) holding each of `names`: the single model.safetensors, or the index's weight_map.
std::map<std::string, std::string> files_of(const std::string& dir, const std::vector<std::string>& names) {
  namespace fs = std::filesystem;
  std::map<std::string, std::string> out;
  const fs::path index = fs::path(dir) / "model.safetensors.index.json";
  if (fs::exists(index)) {
    std::ifstream in(index);
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(in);
    } catch (const nlohmann::json::exception& e) {
      AERIE_THROW(index.string() << ": " << e.what());
    }
    AERIE_CHECK(j.contains("weight_map") && j["weight_map"].is_object(), index.string() << ": no weight_map");
    for (const auto& n : names) {
      AERIE_CHECK(j["weight_map"].contains(n), index.string() << ": weight_map has no " << n);
      out[n] = j["weight_map"][n].get<std::string>();
    }
    return out;
  }
  for (const auto& n : names) out[n] = "model.safetensors";
  return out;
}

}  // namespace

TargetHead load_target_head(const std::string& dir, const LlamaConfig& cfg) {
  const std::string embed_name = "model.embed_tokens.weight", head_name = "lm_head.weight";
  std::vector<std::string> names = {embed_name};
  if (!cfg.tie_word_embeddings) names.push_back(head_name);
  const auto files = files_of(dir, names);
  std::map<std::string, Tensor> found;
  std::map<std::string, std::vector<std::string>> by_file;
  for (const auto& [n, f] : files) by_file[f].push_back(n);
  for (const auto& [f, ns] : by_file) {
    const std::string path = dir + "/" + f;
    SafetensorsFile st = load_safetensors(path);
    for (const auto& n : ns) {
      auto it = st.tensors.find(n);
      AERIE_CHECK(it != st.tensors.end(), path << ": tensor " << n << " missing");
      it->second.check_shape({cfg.vocab_size, cfg.hidden_size}, path + ": " + n);
      found[n] = it->second.dtype() == DType::F32 ? it->second : it->second.to(DType::F32);
    }
  }
  TargetHead h;
  h.embed_tokens = found.at(embed_name);
  h.lm_head = cfg.tie_word_embeddings ? h.embed_tokens : found.at(head_name);
  return h;
}

}  // namespace aerie
