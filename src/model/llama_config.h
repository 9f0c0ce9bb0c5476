// The target model's configuration, read from a Hugging Face config.json (LlamaForCausalLM layout;
// Mistral and Qwen2/3 differ only in fields this struct carries).
#pragma once
#include <nlohmann/json.hpp>
#include <string>

#include "kernels/rope.h"

namespace aerie {

struct LlamaConfig {
  int64_t hidden_size = 0, intermediate_size = 0, num_hidden_layers = 0;
  int64_t num_attention_heads = 0, num_key_value_heads = 0, head_dim = 0;
  int64_t vocab_size = 0, max_position_embeddings = 0;
  double rms_norm_eps = 1e-5;
  RopeParams rope;
  bool tie_word_embeddings = false;
  int64_t bos_token_id = -1, eos_token_id = -1;
  nlohmann::json raw;  // the whole config.json (rope_scaling etc. are copied into the draft config)
};

/// Reads "<dir>/config.json". head_dim defaults to hidden_size / num_attention_heads,
/// num_key_value_heads to num_attention_heads. Throws aerie::Error naming the file and field.
LlamaConfig load_llama_config(const std::string& dir);

/// The default aux layers of eagle3.md section 1: (2, N/2, N-3), vLLM's "input to layer k" convention,
/// verbatim (N = 5 gives (2, 2, 2); below N = 6 the ids are not ascending). Throws aerie::Error if N < 3.
std::vector<int> default_aux_layers(int64_t num_hidden_layers);

}  // namespace aerie
