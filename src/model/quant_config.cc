// QuantConfig from config.json's quantization_config (model/quant_config.h).
#include "model/quant_config.h"

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

QuantConfig read_quant_config(const json& j, const std::string& path) {
  QuantConfig q;
  q.path = path;
  if (!j.contains("quantization_config") || j["quantization_config"].is_null()) return q;
  const json& c = j["quantization_config"];
  const std::string w = "quantization_config";
  AERIE_CHECK(c.is_object(), path << ": " << w << " is not an object");
  AERIE_CHECK(c.contains("quant_method") && c["quant_method"].is_string(),
              path << ": " << w << ".quant_method is missing or not a string");
  const std::string method = c["quant_method"].get<std::string>();
  if (method == "fp8") {
    only_fields(c, w, {"quant_method", "fmt", "weight_block_size", "activation_scheme"}, path);
    expect_field(c, w, "fmt", "e4m3", path);
    expect_field(c, w, "weight_block_size", json::array({128, 128}), path);
    expect_field(c, w, "activation_scheme", "dynamic", path, true);  // aerie's GEMMs take bf16/f32 inputs
    q.method = QuantConfig::Method::Fp8Block;
    return q;
  }
  AERIE_CHECK(method == "compressed-tensors", path << ": " << w << ".quant_method \"" << method
                                                   << "\" is not supported (\"fp8\" or \"compressed-tensors\")");
  only_fields(c, w,
              {"quant_method", "format", "config_groups", "ignore", "kv_cache_scheme", "quantization_status",
               "sparsity_config", "global_compression_ratio", "version"},
              path);
  expect_field(c, w, "format", "pack-quantized", path);
  expect_field(c, w, "kv_cache_scheme", nullptr, path, true);
  expect_field(c, w, "quantization_status", "compressed", path, true);
  if (c.contains("sparsity_config"))
    AERIE_CHECK(c["sparsity_config"].is_null() || c["sparsity_config"].empty(),
                path << ": " << w << ".sparsity_config " << c["sparsity_config"].dump() << " is not supported");
  if (c.contains("ignore")) AERIE_CHECK(c["ignore"].is_array(), path << ": " << w << ".ignore is not a list");
  AERIE_CHECK(c.contains("config_groups") && c["config_groups"].is_object() && c["config_groups"].size() == 1,
              path << ": " << w << ".config_groups must hold exactly one group");
  const auto& [gname, g] = *c["config_groups"].items().begin();
  const std::string gw = w + ".config_groups." + gname;
  AERIE_CHECK(g.is_object(), path << ": " << gw << " is not an object");
  only_fields(g, gw, {"targets", "weights", "input_activations", "output_activations", "format"}, path);
  expect_field(g, gw, "targets", json::array({"Linear"}), path);
  expect_field(g, gw, "input_activations", nullptr, path, true);  // W4A16: activations stay bf16
  expect_field(g, gw, "output_activations", nullptr, path, true);
  expect_field(g, gw, "format", "pack-quantized", path, true);
  AERIE_CHECK(g.contains("weights") && g["weights"].is_object(), path << ": " << gw << ".weights is missing");
  const json& ws = g["weights"];
  const std::string ww = gw + ".weights";
  only_fields(ws, ww,
              {"num_bits", "type", "symmetric", "strategy", "group_size", "dynamic", "actorder", "block_structure",
               "observer", "observer_kwargs"},
              path);
  expect_field(ws, ww, "num_bits", 4, path);
  expect_field(ws, ww, "type", "int", path);
  expect_field(ws, ww, "symmetric", true, path);
  expect_field(ws, ww, "strategy", "group", path);
  expect_field(ws, ww, "group_size", 32, path);
  expect_field(ws, ww, "dynamic", false, path, true);
  expect_field(ws, ww, "actorder", nullptr, path, true);
  expect_field(ws, ww, "block_structure", nullptr, path, true);
  q.method = QuantConfig::Method::Int4Group;
  return q;
}

}  // namespace aerie
