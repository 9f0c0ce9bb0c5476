// Internal to the model layer: the state behind TargetModel (target.cc builds it, decoder.cc runs the
// decoder-layer scaffold over it).
#pragma once
#include <string>
#include <utility>
#include <vector>

#include "comm/communicator.h"
#include "model/blocks.h"
#include "model/op_profile.h"
#include "model/target.h"

namespace aerie {

/// A target's weights as its layers are built from a WeightSource: what TargetModel holds, and what the
/// memory plan (model/memory_plan.h) counts over a source of shapes only.
struct TargetWeights {
  Tensor embed_tokens;               // [V, H]
  Tensor norm;                       // [H] F32: final_norm
  std::vector<DecoderLayer> layers;  // [num_hidden_layers]
  Tensor lm_head;                    // [V, H]; embed_tokens itself when tied
  // The multi-token-prediction layers' prefixes ("model.layers.61.") and how many tensors each held.
  std::vector<std::pair<std::string, int64_t>> mtp_skipped;
};

/// Builds the target of `cfg` from `src` in the loader's order, which fixes the random weights' draws:
/// embed_tokens, the final norm, the decoder layers by the architecture table (each under a
/// WeightSource::Scope of its index), the MTP layers skipped (skip_prefix), lm_head (or, tied, the
/// embedding, skipping a checkpoint's lm_head copy). The caller sets the source's expert parallelism and
/// FP8 GEMMs first and calls src.finish() after. Throws aerie::Error from the source (a missing or
/// misshapen tensor), the blocks (a tp that does not divide their heads or intermediate sizes) or the
/// table (an unbuilt architecture), and when an untied checkpoint has no lm_head.
TargetWeights build_target_weights(WeightSource& src, const TargetConfig& cfg);

/// Where TargetModelOptions::tp_overlap splits a forward of the sequences `ids`: the sequence boundary nearest
/// half the rows (the first of two equally near), so that micro-batch 0 is ids[0, split) and 1 ids[split, B);
/// 0 (one batch) unless it is a packed prefill of two or more sequences without KV caches (`caches` empty or
/// all null) and without a token `tree` on a tp group of `tp` >= 2 ranks.
int64_t overlap_split(const std::vector<std::vector<int32_t>>& ids, const std::vector<KVCache*>& caches, bool tree,
                      int tp);

struct TargetModel::Impl {
  Communicator* tp = nullptr;
  Device device = Device::CPU;
  DType dtype = DType::F32;  // compute dtype (weights, KV cache, GEMM inputs)
  Tensor embed_tokens;       // [V, H] compute dtype, replicated on every tp rank
  Tensor lm_head;            // [V, H] compute dtype, replicated; shares storage with embed_tokens when tied
  Tensor norm;               // [H] F32: final_norm
  std::vector<DecoderLayer> layers;
  OpProfile profile;  // on with AERIE_PROFILE=1 (op_profile.h)
  bool tp_overlap = false;  // TargetModelOptions::tp_overlap
};

}  // namespace aerie
