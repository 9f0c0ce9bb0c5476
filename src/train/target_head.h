// The two target tensors draft training needs: the token embedding (the draft's frozen embed_tokens) and
// the output matrix W_lm (target logits from the stored final hidden states; the draft lm_head's
// initial rows). Read straight from the Hugging Face checkpoint, without building the target model.
#pragma once
#include <string>

#include "core/tensor.h"
#include "model/target_config.h"

namespace aerie {

struct TargetHead {
  Tensor embed_tokens;  // [V, H] F32: model.embed_tokens.weight
  Tensor lm_head;       // [V, H] F32: lm_head.weight, or the same storage as embed_tokens when tied
  DType lm_head_stored = DType::F32;  // the checkpoint's dtype of W_lm (of embed_tokens when tied)
};

/// Reads <P>embed_tokens.weight and the lm_head (unless cfg.tie_word_embeddings) from `dir`'s
/// model.safetensors or the shards of model.safetensors.index.json, converted to F32 from F32, BF16 or
/// F16; P is "model." or a multimodal wrapper's prefix (HfCheckpoint in model/hf_checkpoint.h), and
/// only these two tensors are read. Throws aerie::Error naming the file and tensor if one is missing
/// or not [V, H], or holds a NaN or an infinity (naming the element).
TargetHead load_target_head(const std::string& dir, const TargetConfig& cfg);

}  // namespace aerie
