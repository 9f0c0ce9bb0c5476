// Internal to the model layer: the state behind TargetModel (target.cc builds it, decoder.cc runs the
// decoder-layer scaffold over it).
#pragma once
#include <vector>

#include "comm/communicator.h"
#include "model/blocks.h"
#include "model/op_profile.h"
#include "model/target.h"

namespace aerie {

struct TargetModel::Impl {
  Communicator* tp = nullptr;
  Device device = Device::CPU;
  DType dtype = DType::F32;  // compute dtype (weights, KV cache, GEMM inputs)
  Tensor embed_tokens;       // [V, H] compute dtype, replicated on every tp rank
  Tensor lm_head;            // [V, H] compute dtype, replicated; shares storage with embed_tokens when tied
  Tensor norm;               // [H] F32: final_norm
  std::vector<DecoderLayer> layers;
  OpProfile profile;  // on with AERIE_PROFILE=1 (op_profile.h)
};

}  // namespace aerie
