// The target: a decoder-only language model read from a Hugging Face directory (config.json +
// model.safetensors or sharded safetensors, F32/BF16/F16), a sequence of decoder layers built from
// blocks (attention, FFN; model/blocks.h) that the architecture table (model/arch.h) picks by the
// config's model_type: today the Llama 2/3.x, Mistral, Qwen2/2.5 (q/k/v biases) and Qwen3 (q/k
// RMSNorm) families (GQA attention, SwiGLU, tied or untied lm_head). Split by tensor parallelism over
// the ranks of a tp group (Megatron-LM column/row parallel linears, one all-reduce per block).
// Reference: transformers' modeling_{llama,mistral,qwen2,qwen3}.py.
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "model/target_config.h"

namespace aerie {

class WeightSource;

/// KV cache of one sequence for this rank's part of each layer's attention block: per layer K and V
/// [max_len, row...] of `dtype` (the model's compute dtype, F32 or BF16) on `device` (the model's); for
/// GQA the rows are [n_kv_local, d], keys stored after RoPE (and Qwen3's k_norm); for MLA K holds the
/// latent [kv_lora + rope] and V is undefined. Made by
/// TargetModel::make_cache. A copy shares the storage (Tensor semantics): copy the tensors to fork. A
/// sliding-window layer keeps every position too.
class KVCache {
 public:
  /// Zeroed K and V of max_len positions per layer, layer l's rows k_rows[l] / v_rows[l] (an empty
  /// v row: no V tensor, as MLA's latent cache, which keeps everything in K). Throws
  /// aerie::Error on a negative max_len or lists of different lengths.
  KVCache(const std::vector<Shape>& k_rows, const std::vector<Shape>& v_rows, int64_t max_len,
          Device device = Device::CPU, DType dtype = DType::F32);
  int64_t length() const { return length_; }
  int64_t capacity() const { return max_len_; }
  /// Drops positions >= len (rejected draft tokens). Throws if len > length().
  void truncate(int64_t len);
  /// Keeps, of the positions from .. length()-1, the ones at from + rows[j] as positions from + j (a
  /// verified tree's accepted path: rows ascending, rows[j] >= j), and drops the rest: length() becomes
  /// from + rows.size(). Throws aerie::Error on rows that are not ascending or reach past length().
  void keep_rows(int64_t from, const std::vector<int64_t>& rows);

  // Used by TargetModel.
  std::vector<Tensor> k, v;
  int64_t length_ = 0, max_len_ = 0;
};

/// Outputs on the model's device. aux_hidden and final_hidden have the model's compute dtype (F32, or
/// BF16: the F32 residual stream rounded once to bf16); logits are F32 in both modes.
struct TargetOutput {
  Tensor logits;        // [n, V] F32, undefined unless asked for
  Tensor aux_hidden;    // [n, 3H] F32|BF16: concat of r^{a_1}, r^{a_2}, r^{a_3} (eagle3.md section 1)
  Tensor final_hidden;  // [n, H] F32|BF16: z = final_norm(r^N)
};

/// Where the target runs and in which precision.
///  - F32: every weight and activation F32 (the reference; on CUDA the GEMMs are true fp32, no TF32).
///  - BF16: weights (except the RMSNorm weights, kept F32: exact for a bf16 checkpoint) and the KV cache
///    in bf16; the residual stream r stays F32; the RMSNorm outputs, q/k/v, attention output and the MLP
///    activations are bf16 (inputs of the GEMMs); o_proj and down_proj write F32 for the residual add
///    (and the tp all-reduce). Every GEMM and kernel accumulates in fp32. This is the precision of
///    transformers' bf16 forward except that aerie's residual stream is not rounded to bf16 per layer.
/// On CUDA the caller has selected the rank's GPU (cuda::select_device) and passes a tp communicator
/// that reduces device tensors (NcclCommunicator) when tp > 1.
/// expert_parallel: the routed experts of an MoE layer are split over the tp group by expert (rank r
/// of tp holds experts [r E / tp, (r + 1) E / tp) whole and computes only the pairs routed to them)
/// instead of by moe_intermediate_size; the router, attention and shared experts split as before and
/// the block keeps its one all-reduce, so the hidden states are tp's up to the order of the fp32 sums.
/// Needs tp to divide n_routed_experts (aerie::Error otherwise); no effect at tp 1 or on dense models.
struct TargetModelOptions {
  Device device = Device::CPU;
  DType dtype = DType::F32;  // F32 or BF16
  bool expert_parallel = false;
  /// W8A8 block-FP8 GEMMs for every Linear (Linear::use_fp8_gemm; --fp8-gemm): a BF16/F32 weight is
  /// quantized to 128 x 128 block FP8 at load, a block-FP8 checkpoint's weight is used as stored.
  bool fp8_gemm = false;
  /// Two micro-batches in a packed prefill on a tp group of two or more ranks (--tp-overlap): the batch's
  /// sequences split at the boundary nearest half its rows, and each block's all-reduce of one micro-batch
  /// runs while the other computes (Communicator::start_all_reduce_sum: NCCL on a side stream, MPI's
  /// MPI_Iallreduce), as SGLang's two-batch overlap does for DeepSeek's expert-parallel all-to-all. Each
  /// row's values are as without it where the blocks' kernels compute a row the same at half the rows (the
  /// tests' tolerance). Forwards with a KV cache, a token tree or one sequence run as one batch.
  bool tp_overlap = false;
};

/// Why TargetModelOptions::tp_overlap can split no forward of a job that runs the target at tp `tp_size` with
/// forwards of up to `batch_tokens` tokens of samples (0: one sample per forward): "at tp 1 (no all-reduce)", "with
/// --batch-tokens 0 (one sample per forward)", or "" when it can. For the jobs' log lines and warnings.
std::string tp_overlap_unused(int tp_size, int64_t batch_tokens);

class TargetModel {
 public:
  /// Loads <dir>/config.json and <dir>/model.safetensors or the shards of model.safetensors.index.json
  /// on the CPU in F32, keeping this tp rank's shard of every linear. Throws aerie::Error naming the
  /// file/tensor on missing or mis-shaped weights, on a language-model tensor no block reads (another
  /// architecture), or when heads/kv heads/intermediate size are not divisible by tp.
  TargetModel(const std::string& dir, Communicator& tp);
  /// The same on options.device in options.dtype: every tensor is read alone (only this rank's rows
  /// or columns of it), converted on the host to its dtype (RMSNorm weights F32, the rest the compute
  /// dtype) and copied to the device before the next is read (checkpoint_weights). Throws as above, or
  /// aerie::Error when the device is CUDA and the backend/GPU is missing or the weights do not fit.
  TargetModel(const std::string& dir, Communicator& tp, const TargetModelOptions& options);
  /// A model of `cfg`'s shape with random weights, for benchmarks (no checkpoint file): every linear and
  /// the embedding ~ N(0, 0.02^2) (values drawn once on the host from a splitmix64/Box-Muller stream of
  /// `seed` into a pool of ~4M values, then tiled into each tensor from a seed-dependent offset by
  /// device-to-device copies, so an 8B model is made in seconds), RMSNorm weights 1, biases 0.
  static TargetModel random(const TargetConfig& cfg, Communicator& tp, const TargetModelOptions& options,
                           uint64_t seed);
  Device device() const;
  DType dtype() const;
  const TargetConfig& config() const { return cfg_; }

  /// Forward of `ids` (I32) at positions cache->length() .. +n (0.. without a cache), appending to
  /// the cache when given. aux_layers: the layer indices k whose INPUT r^k is captured (0..N; N means
  /// the last layer's output before final_norm); empty captures nothing. Every rank of the tp group
  /// returns the full (all-reduced) tensors.
  TargetOutput forward(const std::vector<int32_t>& ids, KVCache* cache, const std::vector<int>& aux_layers,
                       bool want_logits);
  /// Forward of a token tree after the cached prefix (tree verification of speculative decoding; SpecInfer,
  /// Miao et al. 2024; EAGLE-2): ids[i]'s parent is row parent[i] (parent[0] = -1: row 0, the last
  /// verified token, is the root; parent[i] < i and the rows in breadth-first order, depths ascending).
  /// Row i sits at position cache->length() + depth(i) and attends the cached prefix and its own
  /// ancestors and itself, so each row's outputs equal forward() of its root-to-row path. Its keys and
  /// values go to cache slots length() + i (KVCache::keep_rows keeps an accepted path afterwards). GQA
  /// targets (the Llama family) without a sliding window; throws aerie::Error otherwise, on a malformed
  /// tree, or without a cache of at least one position.
  TargetOutput forward_tree(const std::vector<int32_t>& ids, const std::vector<int32_t>& parent, KVCache* cache,
                            const std::vector<int>& aux_layers, bool want_logits);

  /// Which logits rows forward_batch computes: none, the last row of each sequence ([B, V]), or all
  /// rows ([sum n_b, V]).
  enum class Logits { None, Last, All };
  /// Forward of B sequences at once (batched decoding, several samples per extraction forward): sequence
  /// b's `ids[b]` (non-empty) continue `caches[b]` (positions cache length .. +n_b, appended to it) or,
  /// with `caches` empty or caches[b] null, start at position 0. Each sequence attends only its own
  /// keys; the linears run once over all rows. aux_hidden / final_hidden hold the rows of sequence 0,
  /// then 1, ... ([sum n_b, 3H] / [sum n_b, H]); logits as `logits` says (F32). Every result equals
  /// forward() of each sequence alone up to fp32 summation order. Collective over the tp group; throws
  /// aerie::Error on an empty batch or sequence, a caches vector of another length than ids, or a cache
  /// that cannot hold its new rows.
  TargetOutput forward_batch(const std::vector<std::vector<int32_t>>& ids, const std::vector<KVCache*>& caches,
                             const std::vector<int>& aux_layers, Logits logits);

  /// The hidden-state forwards extract and the streaming target run (data/extract.h's TargetForward and
  /// TargetForwardBatch): forward() / forward_batch() without caches or logits, capturing `aux_layers`, handing
  /// over aux_hidden [T, 3H] and final_hidden [T, H]. The model must outlive them.
  std::function<void(const std::vector<int32_t>&, Tensor&, Tensor&)> hidden_states_forward(std::vector<int> aux_layers);
  std::function<void(const std::vector<std::vector<int32_t>>&, Tensor&, Tensor&)> hidden_states_forward_batch(
      std::vector<int> aux_layers);

  /// The full embedding table [V, H] and lm_head [V, H] (tied: the same tensor), in the compute dtype
  /// on the model's device (F32 on the CPU for the default constructor).
  const Tensor& embed_tokens() const;
  const Tensor& lm_head() const;

  /// The tp group the model was built on (it must outlive the model).
  Communicator& tp() const;
  /// With the environment variable AERIE_PROFILE=1: the time of every forward's ops per category (gemm,
  /// attention, norm, rope, activation, other, all-reduce) summed over this model's forward calls so far,
  /// one line (model/op_profile.h); empty otherwise.
  std::string profile_summary() const;
  /// An empty KV cache of `max_len` positions for this rank's kv heads (model's device and dtype).
  KVCache make_cache(int64_t max_len) const;

 private:
  TargetModel() = default;
  /// Builds the embedding, the decoder layers (by the architecture table) and lm_head from `src`.
  void build(WeightSource& src, Communicator& tp, const TargetModelOptions& options);
  /// The decoder-layer scaffold behind forward() and forward_batch() (decoder.cc); `who` names the
  /// caller in error messages.
  TargetOutput run(const std::vector<std::vector<int32_t>>& ids, const std::vector<KVCache*>& caches,
                   const std::vector<int>& aux_layers, Logits logits, const char* who,
                   const std::vector<int32_t>* tree_parent = nullptr);
  struct Impl;
  std::shared_ptr<Impl> impl_;
  TargetConfig cfg_;
};

/// Greedy decoding without a draft: appends up to max_new tokens to `prompt`, stopping after
/// `stop_id` (when >= 0). Returns prompt + generated ids.
std::vector<int32_t> greedy_generate(TargetModel& model, const std::vector<int32_t>& prompt, int64_t max_new,
                                     int32_t stop_id);
/// The same, stopping after the first generated id that is in `stop_ids`. Collective over the model's
/// tp group (tp rank 0's argmax is broadcast, so all ranks return the same ids).
std::vector<int32_t> greedy_generate(TargetModel& model, const std::vector<int32_t>& prompt, int64_t max_new,
                                     const std::vector<int32_t>& stop_ids);

}  // namespace aerie
