// The two target tensors draft training needs: the token embedding (the draft's frozen embed_tokens) and
// the output matrix W_lm (target logits from the stored final hidden states; the draft lm_head's
// initial rows). Read straight from the Hugging Face checkpoint, without building the target model.
#pragma once
#include <string>

#include "core/tensor.h"
#include "model/llama_config.h"

namespace aerie {

struct TargetHead {
  Tensor embed_tokens;  // [V, H] F32: model.embed_tokens.weight
  Tensor lm_head;       // [V, H] F32: lm_head.weight, or the same storage as embed_tokens when tied
};

/// Reads model.embed_tokens.weight and lm_head.weight (unless cfg.tie_word_embeddings) from
/// `dir`/model.safetensors, or from the files model.safetensors.index.json's weight_map names for them;
/// converted to F32. Throws aerie::Error naming the file and tensor if one is missing or not [V, H].
TargetHead load_target_head(const std::string& dir, const LlamaConfig& cfg);

}  // namespace aerie
