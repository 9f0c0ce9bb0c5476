// The architecture table (model/arch.h).
#include "model/arch.h"

#include <sstream>

#include "core/error.h"

namespace aerie {

// The rows, each defined beside its family's config reader and layer builder.
Architecture llama_architecture();        // arch_llama.cc
Architecture mistral_architecture();      // arch_llama.cc
Architecture qwen2_architecture();        // arch_llama.cc
Architecture qwen3_architecture();        // arch_llama.cc
Architecture deepseek_v3_architecture();  // arch_deepseek.cc
Architecture kimi_k2_architecture();      // arch_deepseek.cc
Architecture qwen3_moe_architecture();    // arch_qwen3_moe.cc
Architecture mixtral_architecture();      // arch_mixtral.cc

const std::vector<Architecture>& architectures() {
  static const std::vector<Architecture> table = {
      llama_architecture(),       mistral_architecture(),  qwen2_architecture(), qwen3_architecture(),
      deepseek_v3_architecture(), kimi_k2_architecture(),  qwen3_moe_architecture(), mixtral_architecture(),
  };
  return table;
}

const Architecture& find_architecture(const std::string& model_type, const std::string& where) {
  std::ostringstream built;
  for (const Architecture& a : architectures()) {
    if (a.build_layer) built << (built.tellp() > 0 ? ", " : "") << a.model_type;
  }
  for (const Architecture& a : architectures()) {
    if (a.model_type != model_type) continue;
    AERIE_CHECK(a.build_layer, where << ": model_type \"" << model_type << "\" (" << a.family << ": " << a.attention
                                     << " attention, " << a.ffn << ") is recognised, but aerie does not build its "
                                     << "blocks yet; supported: " << built.str());
    return a;
  }
  AERIE_THROW(where << ": model_type \"" << model_type << "\" is not supported (" << built.str() << ")");
}

DecoderLayer layer_with_norms(WeightSource& src, const std::string& prefix, int64_t hidden) {
  DecoderLayer L;
  L.input_norm = src.load(prefix + "input_layernorm.weight", {hidden}, TpSplit::None, ParamRole::Norm);
  L.post_norm = src.load(prefix + "post_attention_layernorm.weight", {hidden}, TpSplit::None, ParamRole::Norm);
  return L;
}

}  // namespace aerie
