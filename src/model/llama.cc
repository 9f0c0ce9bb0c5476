// LlamaModel: loading (or random weights), the KV cache and greedy decoding. The layer body of the
// forward is in llama_forward.cc.

#include <algorithm>

#include "core/error.h"
#include "core/log.h"
#include "model/llama.h"
#include "model/llama_impl.h"
#include "model/llama_weights.h"

namespace aerie {

KVCache::KVCache(const LlamaConfig& cfg, int64_t max_len, int tp_size, Device device, DType dtype) {
  AERIE_CHECK(max_len >= 0, "KVCache: negative max_len " << max_len);
  AERIE_CHECK(tp_size >= 1 && cfg.num_key_value_heads % tp_size == 0,
              "KVCache: tp " << tp_size << " does not divide num_key_value_heads " << cfg.num_key_value_heads);
  const int64_t nkv = cfg.num_key_value_heads / tp_size;
  for (int64_t l = 0; l < cfg.num_hidden_layers; ++l) {
    k.push_back(Tensor::zeros({max_len, nkv, cfg.head_dim}, dtype, device));
    v.push_back(Tensor::zeros({max_len, nkv, cfg.head_dim}, dtype, device));
  }
  max_len_ = max_len;
}

void KVCache::truncate(int64_t len) {
  AERIE_CHECK(len >= 0 && len <= length_, "KVCache::truncate(" << len << "): cache holds " << length_);
  length_ = len;
}

LlamaModel::LlamaModel(const std::string& dir, Communicator& tp) : LlamaModel(dir, tp, LlamaModelOptions{}) {}

LlamaModel::LlamaModel(const std::string& dir, Communicator& tp, const LlamaModelOptions& options)
    : impl_(std::make_shared<Impl>()) {
  AERIE_CHECK(options.dtype == DType::F32 || options.dtype == DType::BF16,
              "LlamaModel: compute dtype must be F32 or BF16, got " << dtype_name(options.dtype));
  cfg_ = load_llama_config(dir);
  check_tp_divisible(cfg_, tp.size());
  impl_->w = load_llama_weights(dir, cfg_, tp.rank(), tp.size());
  if (options.device != Device::CPU || options.dtype != DType::F32)
    impl_->w = llama_weights_to(std::move(impl_->w), options.device, options.dtype);
  init(tp, options);
}

LlamaModel LlamaModel::random(const LlamaConfig& cfg, Communicator& tp, const LlamaModelOptions& options,
                              uint64_t seed) {
  AERIE_CHECK(options.dtype == DType::F32 || options.dtype == DType::BF16,
              "LlamaModel::random: compute dtype must be F32 or BF16, got " << dtype_name(options.dtype));
  LlamaModel m;
  m.impl_ = std::make_shared<Impl>();
  m.cfg_ = cfg;
  check_tp_divisible(cfg, tp.size());
  m.impl_->w = random_llama_weights(cfg, tp.rank(), tp.size(), options.device, options.dtype, seed);
  m.init(tp, options);
  return m;
}

void LlamaModel::init(Communicator& tp, const LlamaModelOptions& options) {
  impl_->tp = &tp;
  impl_->inv_freq = llama_rope_inv_freq(cfg_.rope, cfg_.head_dim);
  impl_->device = options.device;
  impl_->dtype = options.dtype;
  impl_->nh = cfg_.num_attention_heads / tp.size();
  impl_->nkv = cfg_.num_key_value_heads / tp.size();
  impl_->inter = cfg_.intermediate_size / tp.size();
  impl_->profile.enable(OpProfile::enabled_by_env());
  fuse_llama_projections(impl_->w);  // one q/k/v GEMM and one gate/up GEMM per layer
}

Device LlamaModel::device() const { return impl_->device; }
DType LlamaModel::dtype() const { return impl_->dtype; }
const Tensor& LlamaModel::embed_tokens() const { return impl_->w.embed_tokens; }
const Tensor& LlamaModel::lm_head() const { return impl_->w.lm_head; }
Communicator& LlamaModel::tp() const { return *impl_->tp; }
std::string LlamaModel::profile_summary() const { return impl_->profile.summary(); }
KVCache LlamaModel::make_cache(int64_t max_len) const {
  return KVCache(cfg_, max_len, impl_->tp->size(), impl_->device, impl_->dtype);
}

std::vector<int32_t> greedy_generate(LlamaModel& model, const std::vector<int32_t>& prompt, int64_t max_new,
                                     int32_t stop_id) {
  return greedy_generate(model, prompt, max_new, stop_id >= 0 ? std::vector<int32_t>{stop_id} : std::vector<int32_t>{});
}

std::vector<int32_t> greedy_generate(LlamaModel& model, const std::vector<int32_t>& prompt, int64_t max_new,
                                     const std::vector<int32_t>& stop_ids) {
  AERIE_CHECK(!prompt.empty(), "greedy_generate: empty prompt");
  std::vector<int32_t> out = prompt;
  if (max_new <= 0) return out;
  KVCache cache = model.make_cache(static_cast<int64_t>(prompt.size()) + max_new);
  Communicator& tp = model.tp();
  // argmax of the last logits row (ties: the smaller id, as llama2.c's argmax), agreed on by the tp
  // group: rank 0's choice is broadcast, so that ranks never diverge even if their all-reduced
  // logits differed in the last bit.
  auto pick = [&](const Tensor& all_logits) {
    const int64_t V = all_logits.dim(1);
    Tensor last = all_logits.slice(all_logits.dim(0) - 1, all_logits.dim(0));
    if (last.device() != Device::CPU) last = last.to_device(Device::CPU);
    const float* row = last.data<float>();
    int32_t best = 0;
    for (int64_t i = 1; i < V; ++i)
      if (row[i] > row[best]) best = static_cast<int32_t>(i);
    if (tp.size() > 1) {
      Tensor t = Tensor::from_vector(std::vector<int32_t>{best}, {1});
      if (model.device() != Device::CPU) t = t.to_device(model.device());  // a device communicator (NCCL)
      tp.broadcast(t, 0);
      if (t.device() != Device::CPU) t = t.to_device(Device::CPU);
      best = t.data<int32_t>()[0];
    }
    return best;
  };
  int32_t next = pick(model.forward(prompt, &cache, {}, true).logits);
  for (int64_t i = 0; i < max_new; ++i) {
    out.push_back(next);
    if (std::find(stop_ids.begin(), stop_ids.end(), next) != stop_ids.end() || i + 1 == max_new) break;
    next = pick(model.forward({next}, &cache, {}, true).logits);
  }
  return out;
}

}  // namespace aerie
