// The architecture table (model/arch.h).
#include "model/arch.h"

#include <sstream>

#include "core/error.h"

namespace aerie {

const std::vector<Architecture>& architectures() {
  // DeepSeek-V3 and the Kimi targets: DeepseekV3ForCausalLM; Kimi-K2.5 wraps it as text_config, whose
  // model_type is deepseek_v3 (or kimi_k2 in other copies). ../shared/docs/deepseek-v3.md.
  static const std::vector<Architecture> table = {
      {"llama", "Llama 2/3.x", "GQA", "dense SwiGLU", build_llama_layer},
      {"mistral", "Mistral", "GQA (sliding window)", "dense SwiGLU", build_llama_layer},
      {"qwen2", "Qwen2/2.5", "GQA (q/k/v biases)", "dense SwiGLU", build_llama_layer},
      {"qwen3", "Qwen3", "GQA (q/k norms)", "dense SwiGLU", build_llama_layer},
      {"deepseek_v3", "DeepSeek-V3/R1, Kimi-K2.5's language model", "MLA",
       "MoE (sigmoid router, shared experts; dense below first_k_dense_replace)", build_deepseek_layer},
      {"kimi_k2", "Kimi-K2", "MLA", "MoE (sigmoid router, shared experts; dense below first_k_dense_replace)",
       build_deepseek_layer},
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
