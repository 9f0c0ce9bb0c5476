// The two target tensors draft training needs: the token embedding (the draft's frozen embed_tokens) and
// the output matrix W_lm (target logits from the stored final hidden states; the draft lm_head's
// initial rows). Read straight from the Hugging Face checkpoint, without building the target model.
#pragma once
#include <string>

#include <vector>

#include "core/tensor.h"
#include "data/shard.h"
#include "model/draft.h"
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

/// The TTT samples of one training step: make_ttt_sample of each of `samples` (hidden states F32 or BF16 on the
/// host), with each sample's aux_hidden on `device`. On the CPU (lm_head there): make_ttt_sample per sample, aux
/// kept on the host. On a GPU: the final hidden states of all samples go up in one copy, their targets come from
/// one target_distribution call and one argmax download, and the aux hidden states go up in one copy, each
/// sample's aux_hidden and target_probs a row slice of the step's tensors: a step's copies and waits once, not
/// once per sample (eagle3.md section 1 for the targets; the same values as per sample, up to the GEMM's
/// summation order in the other row count). Every sample's hidden states must share one dtype and width.
/// Throws what make_ttt_sample throws.
std::vector<TTTSample> make_step_samples(std::vector<HiddenSample> samples, const Tensor& lm_head,
                                         const std::vector<int64_t>& selected, Device device);

}  // namespace aerie
