// QuantConfig from config.json's quantization_config (model/quant_config.h).
#include "model/quant_config.h"

#include <algorithm>
#include <cctype>
#include <set>

#include "core/error.h"

namespace aerie {

namespace {

using nlohmann::json;

/// `o[key]` must equal `want` (when `optional`, it may also be absent).
void expect_field(const json& o, const std::string& where, const char* key, const json& want,
                  const std::string& path, bool optional = false) {
  if (!o.contains(key)) {
    AERIE_CHECK(optional, path << ": " << where << "." << key << " is missing (expected " << want.dump() << ")");
    return;
  }
  AERIE_CHECK(o[key] == want, path << ": " << where << "." << key << " is " << o[key].dump() << ", aerie supports "
                                   << want.dump() << " only");
}

void only_fields(const json& o, const std::string& where, const std::set<std::string>& allowed,
                 const std::string& path) {
  for (const auto& [k, v] : o.items())
    AERIE_CHECK(allowed.count(k), path << ": " << where << "." << k << " (" << v.dump()
                                       << ") is not supported by aerie's dequantization");
}

}  // namespace

const json* quantization_config_source(const json& top, std::string* where, bool* shadows) {
  const auto present = [](const json& o, const char* key) {
    return o.is_object() && o.contains(key) && !o[key].is_null();
  };
  const json* text = top.is_object() && top.contains("text_config") && top["text_config"].is_object()
                         ? &top["text_config"]
                         : nullptr;
  std::string name;
  const json* chosen = nullptr;
  bool shadowed = false;
  if (present(top, "quantization_config")) {
    chosen = &top["quantization_config"];
    name = "quantization_config";
    shadowed = text != nullptr && present(*text, "quantization_config") && (*text)["quantization_config"] != *chosen;
  } else if (text != nullptr && present(*text, "quantization_config")) {
    chosen = &(*text)["quantization_config"];
    name = "text_config.quantization_config";
  } else if (present(top, "compression_config")) {
    chosen = &top["compression_config"];
    name = "compression_config";
  }
  if (where != nullptr) *where = name;
  if (shadows != nullptr) *shadows = shadowed;
  return chosen;
}

std::string describe(QuantConfig::Method m) {
  switch (m) {
    case QuantConfig::Method::Fp8Block: return "block FP8 (quant_method fp8)";
    case QuantConfig::Method::Int4Group: return "INT4 (compressed-tensors pack-quantized)";
    case QuantConfig::Method::None: break;
  }
  return "no quantization";
}

QuantConfig read_quant_config(const json& top, const std::string& path) {
  QuantConfig q;
  q.path = path;
  std::string w;
  bool shadows = false;
  const json* source = quantization_config_source(top, &w, &shadows);
  if (source == nullptr) return q;
  q.where = w;
  q.shadows = shadows;
  // Messages start "<file>: <field>..."; with two different quantization_configs, which one was read.
  const std::string at = shadows ? path + " (its top-level quantization_config, read before text_config's other one, "
                                          "as vLLM reads them)"
                                 : path;
  const json& c = *source;
  AERIE_CHECK(c.is_object(), at << ": " << w << " is not an object: " << c.dump());
  AERIE_CHECK(c.contains("quant_method") && c["quant_method"].is_string(),
              at << ": " << w << ".quant_method is missing or not a string"
                   << (c.contains("quant_method") ? ": " + c["quant_method"].dump() : std::string()));
  std::string method = c["quant_method"].get<std::string>();
  std::transform(method.begin(), method.end(), method.begin(),
                 [](unsigned char ch) { return static_cast<char>(std::tolower(ch)); });
  if (method == "fp8") {
    only_fields(c, w, {"quant_method", "fmt", "weight_block_size", "activation_scheme"}, at);
    expect_field(c, w, "fmt", "e4m3", at);
    expect_field(c, w, "weight_block_size", json::array({128, 128}), at);
    expect_field(c, w, "activation_scheme", "dynamic", at, true);  // aerie's GEMMs take bf16/f32 inputs
    q.method = QuantConfig::Method::Fp8Block;
    return q;
  }
  AERIE_CHECK(method == "compressed-tensors", at << ": " << w << ".quant_method \"" << method
                                                   << "\" is not supported (\"fp8\" or \"compressed-tensors\")");
  only_fields(c, w,
              {"quant_method", "format", "config_groups", "ignore", "kv_cache_scheme", "quantization_status",
               "sparsity_config", "global_compression_ratio", "version"},
              at);
  expect_field(c, w, "format", "pack-quantized", at);
  expect_field(c, w, "kv_cache_scheme", nullptr, at, true);
  expect_field(c, w, "quantization_status", "compressed", at, true);
  if (c.contains("sparsity_config"))
    AERIE_CHECK(c["sparsity_config"].is_null() || c["sparsity_config"].empty(),
                at << ": " << w << ".sparsity_config " << c["sparsity_config"].dump() << " is not supported");
  if (c.contains("ignore")) AERIE_CHECK(c["ignore"].is_array(), at << ": " << w << ".ignore is not a list");
  AERIE_CHECK(c.contains("config_groups") && c["config_groups"].is_object() && c["config_groups"].size() == 1,
              at << ": " << w << ".config_groups must hold exactly one group");
  // The one group's name and value, read off an iterator that outlives them (a structured binding to
  // *items().begin() refers into a temporary iterator).
  const auto group = c["config_groups"].begin();
  const std::string gname = group.key();
  const nlohmann::json& g = group.value();
  const std::string gw = w + ".config_groups." + gname;
  AERIE_CHECK(g.is_object(), at << ": " << gw << " is not an object");
  only_fields(g, gw, {"targets", "weights", "input_activations", "output_activations", "format"}, at);
  expect_field(g, gw, "targets", json::array({"Linear"}), at);
  expect_field(g, gw, "input_activations", nullptr, at, true);  // W4A16: activations stay bf16
  expect_field(g, gw, "output_activations", nullptr, at, true);
  expect_field(g, gw, "format", "pack-quantized", at, true);
  AERIE_CHECK(g.contains("weights") && g["weights"].is_object(), at << ": " << gw << ".weights is missing");
  const json& ws = g["weights"];
  const std::string ww = gw + ".weights";
  only_fields(ws, ww,
              {"num_bits", "type", "symmetric", "strategy", "group_size", "dynamic", "actorder", "block_structure",
               "observer", "observer_kwargs"},
              at);
  expect_field(ws, ww, "num_bits", 4, at);
  expect_field(ws, ww, "type", "int", at);
  expect_field(ws, ww, "symmetric", true, at);
  expect_field(ws, ww, "strategy", "group", at);
  expect_field(ws, ww, "group_size", 32, at);
  expect_field(ws, ww, "dynamic", false, at, true);
  expect_field(ws, ww, "actorder", nullptr, at, true);
  expect_field(ws, ww, "block_structure", nullptr, at, true);
  q.method = QuantConfig::Method::Int4Group;
  return q;
}

}  // namespace aerie
