// Internal to the model layer: the state behind LlamaModel (llama.cc builds it, llama_forward.cc runs
// the layer body on it).
#pragma once
#include <vector>

#include "comm/communicator.h"
#include "model/llama.h"
#include "model/llama_weights.h"
#include "model/op_profile.h"

namespace aerie {

struct LlamaModel::Impl {
  Communicator* tp = nullptr;
  Device device = Device::CPU;
  DType dtype = DType::F32;  // compute dtype (weights, KV cache, GEMM inputs)
  LlamaWeights w;
  std::vector<float> inv_freq;
  int64_t nh = 0, nkv = 0, inter = 0;  // this rank's heads, kv heads, MLP width
  OpProfile profile;                   // on with AERIE_PROFILE=1 (op_profile.h)
};

}  // namespace aerie
