// The target: a Llama-family decoder (RMSNorm, RoPE, GQA attention, SwiGLU, tied or untied lm_head) of
// the Llama 2/3.x, Mistral, Qwen2/2.5 (q/k/v biases) and Qwen3 (q/k RMSNorm) families, read from a
// Hugging Face directory (config.json + model.safetensors or sharded safetensors, F32/BF16/F16) and
// split by tensor parallelism over the ranks of a tp group (Megatron-LM column/row parallel linears,
// one all-reduce after o_proj and one after down_proj). Reference: transformers'
// modeling_{llama,mistral,qwen2,qwen3}.py.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "model/llama_config.h"

namespace aerie {

/// KV cache of one sequence for this rank's heads: per layer K and V [max_len, n_kv_local, d] F32 on
/// `device` (the model's). Keys are stored after RoPE (and Qwen3's k_norm). A copy shares the storage
/// (Tensor semantics): copy the tensors to fork. A sliding-window layer keeps every position too.
class KVCache {
 public:
  KVCache(const LlamaConfig& cfg, int64_t max_len, int tp_size, Device device = Device::CPU);
  int64_t length() const { return length_; }
  int64_t capacity() const { return max_len_; }
  /// Drops positions >= len (rejected draft tokens). Throws if len > length().
  void truncate(int64_t len);

  // Used by LlamaModel.
  std::vector<Tensor> k, v;
  int64_t length_ = 0, max_len_ = 0;
};

struct TargetOutput {
  Tensor logits;        // [n, V] F32, undefined unless asked for
  Tensor aux_hidden;    // [n, 3H] F32: concat of r^{a_1}, r^{a_2}, r^{a_3} (eagle3.md section 1)
  Tensor final_hidden;  // [n, H] F32: z = final_norm(r^N)
};

class LlamaModel {
 public:
  /// Loads <dir>/config.json and <dir>/model.safetensors or the shards of model.safetensors.index.json
  /// (weights converted to F32; see load_llama_weights), keeping this tp rank's shard of every linear. Throws aerie::Error naming the file/tensor on missing or
  /// mis-shaped weights, or when heads/kv heads/intermediate size are not divisible by tp.
  LlamaModel(const std::string& dir, Communicator& tp);
  const LlamaConfig& config() const { return cfg_; }

  /// Forward of `ids` (I32) at positions cache->length() .. +n (0.. without a cache), appending to
  /// the cache when given. aux_layers: the layer indices k whose INPUT r^k is captured (0..N; N means
  /// the last layer's output before final_norm); empty captures nothing. Every rank of the tp group
  /// returns the full (all-reduced) tensors.
  TargetOutput forward(const std::vector<int32_t>& ids, KVCache* cache, const std::vector<int>& aux_layers,
                       bool want_logits);

  /// The full embedding table [V, H] F32 and lm_head [V, H] F32 (tied: the same tensor).
  const Tensor& embed_tokens() const;
  const Tensor& lm_head() const;

  /// The tp group the model was built on (it must outlive the model).
  Communicator& tp() const;
  /// An empty KV cache of `max_len` positions for this rank's kv heads.
  KVCache make_cache(int64_t max_len) const;

 private:
  struct Impl;
  std::shared_ptr<Impl> impl_;
  LlamaConfig cfg_;
};

/// Greedy decoding without a draft: appends up to max_new tokens to `prompt`, stopping after
/// `stop_id` (when >= 0). Returns prompt + generated ids.
std::vector<int32_t> greedy_generate(LlamaModel& model, const std::vector<int32_t>& prompt, int64_t max_new,
                                     int32_t stop_id);
/// The same, stopping after the first generated id that is in `stop_ids`. Collective over the model's
/// tp group (tp rank 0's argmax is broadcast, so all ranks return the same ids).
std::vector<int32_t> greedy_generate(LlamaModel& model, const std::vector<int32_t>& prompt, int64_t max_new,
                                     const std::vector<int32_t>& stop_ids);

}  // namespace aerie
