// Internal to the model layer (and train/target_head): a Hugging Face checkpoint directory read tensor
// by tensor, and the target's weights as this tp rank holds them.
#pragma once
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "io/safetensors.h"
#include "model/llama_config.h"

namespace aerie {

/// The tensors of a Hugging Face checkpoint directory: <dir>/model.safetensors, or the shards named by
/// <dir>/model.safetensors.index.json's weight_map. Only headers are read at construction; tensor data
/// is read on demand. The decoder's names are found under "model." (CausalLM), or under a multimodal
/// wrapper's "model.language_model." (transformers 5) or "language_model.model." (transformers 4).
class HfCheckpoint {
 public:
  /// Throws aerie::Error naming the file on a missing checkpoint, a bad index (no weight_map, a shard
  /// that does not exist, a tensor the index puts in a shard that lacks it, a tensor in two shards) or
  /// when no embed_tokens.weight is found under any known prefix.
  explicit HfCheckpoint(const std::string& dir);
  const std::string& dir() const { return dir_; }
  /// "model.", "model.language_model." or "language_model.model.": the prefix of embed_tokens.weight,
  /// layers.{i}.* and norm.weight.
  const std::string& decoder_prefix() const { return prefix_; }
  /// "lm_head.weight" or "language_model.lm_head.weight"; empty when the checkpoint has none.
  const std::string& lm_head_name() const { return lm_head_; }
  bool contains(const std::string& name) const { return where_.count(name) > 0; }
  /// The file holding `name`, or, for a name the checkpoint lacks, the file(s) that were searched.
  std::string file_of(const std::string& name) const;
  /// Tensor `name` converted to F32 (from F32, BF16 or F16) after checking its full shape against
  /// `shape`; rows [begin, end) of dim 0 only when end >= 0 (a tensor-parallel shard, read alone).
  /// Throws aerie::Error naming the tensor and its file when it is missing or misshapen.
  Tensor get(const std::string& name, const Shape& shape, int64_t begin = 0, int64_t end = -1);
  /// Tensors of the language model (under the decoder prefix, and the lm_head) that get() has not
  /// read; other tensors of a multimodal wrapper (vision tower, projector) are not listed.
  std::vector<std::string> unread_language_model_tensors() const;
  Shape shape_of(const std::string& name) const;

 private:
  std::string dir_, prefix_, lm_head_, index_path_;
  std::vector<std::unique_ptr<SafetensorsReader>> files_;
  std::map<std::string, const SafetensorsReader*> where_;
  std::set<std::string> read_;
};

/// One decoder layer, this rank's shard, all F32. nh = n_heads / tp, nkv = n_kv_heads / tp,
/// I_l = intermediate_size / tp (Megatron-LM: q/k/v/gate/up column-parallel, o/down row-parallel).
/// Optional tensors are undefined when the config has none.
struct LlamaLayerWeights {
  Tensor input_layernorm, post_attention_layernorm;  // [H] (replicated)
  Tensor q_proj;                                     // [nh d, H]   rows of this rank's heads
  Tensor k_proj, v_proj;                             // [nkv d, H]
  Tensor o_proj;                                     // [H, nh d]   columns of this rank's heads
  Tensor gate_proj, up_proj;                         // [I_l, H]
  Tensor down_proj;                                  // [H, I_l]
  Tensor q_bias;                                     // [nh d]   optional (cfg.qkv_bias)
  Tensor k_bias, v_bias;                             // [nkv d]  optional (cfg.qkv_bias)
  Tensor o_bias;                                     // [H] replicated, added after the all-reduce (cfg.o_bias)
  Tensor gate_bias, up_bias;                         // [I_l]    optional (cfg.mlp_bias)
  Tensor down_bias;                                  // [H] replicated, added after the all-reduce (cfg.mlp_bias)
  Tensor q_norm, k_norm;                             // [d] replicated, optional (cfg.qk_norm)
  // After fuse_llama_projections (LlamaModel does it at load): the packed weights of one GEMM each;
  // q/k/v_proj, gate/up_proj and their biases are then views of these tensors' rows.
  Tensor qkv_proj;      // [(nh + 2 nkv) d, H] rows: q_proj, k_proj, v_proj
  Tensor qkv_bias;      // [(nh + 2 nkv) d] optional (cfg.qkv_bias)
  Tensor gate_up_proj;  // [2 I_l, H] rows: gate_proj, up_proj
  Tensor gate_up_bias;  // [2 I_l] optional (cfg.mlp_bias)
};

struct LlamaWeights {
  Tensor embed_tokens;  // [V, H] F32, replicated on every tp rank
  Tensor lm_head;       // [V, H] F32, replicated; shares storage with embed_tokens when tied
  Tensor norm;          // [H] final_norm
  std::vector<LlamaLayerWeights> layers;
};

/// Loads `dir`'s weights (Hugging Face names under the decoder prefix P of HfCheckpoint: P
/// embed_tokens.weight, P layers.{i}.self_attn.{q,k,v,o}_proj.{weight,bias}, P layers.{i}.self_attn.
/// {q,k}_norm.weight, P layers.{i}.mlp.{gate,up,down}_proj.{weight,bias}, P layers.{i}.{input,
/// post_attention}_layernorm.weight, P norm.weight, lm_head.weight unless tied; biases and norms as the
/// config says), converted to F32 and sharded for tp rank `tp_rank` of `tp_size`. Throws aerie::Error
/// naming the file and tensor on a missing or mis-shaped weight, on a language-model tensor the config
/// does not account for (another architecture), and when heads, kv heads or intermediate_size are not
/// divisible by tp_size.
LlamaWeights load_llama_weights(const std::string& dir, const LlamaConfig& cfg, int tp_rank, int tp_size);

/// `w` with every linear, bias and the embedding/lm_head converted to `dtype` (F32 or BF16, round to
/// nearest even) and everything moved to `device`; the RMSNorm weights (norm, layer norms, q/k norms)
/// stay F32. A tied lm_head keeps sharing the embedding's storage. The host copies are released tensor
/// by tensor (w is consumed).
LlamaWeights llama_weights_to(LlamaWeights w, Device device, DType dtype);

/// Random weights of this tp rank's shard shapes (as load_llama_weights would give), made directly on
/// `device` in `dtype`: linears and embedding ~ N(0, std^2) tiled from a pool of ~4M values drawn on
/// the host (splitmix64 + Box-Muller of `seed`; each tensor starts at its own seed-dependent offset),
/// RMSNorm weights 1 (F32), biases 0. For benchmarks: the values are normal but repeat with the pool's
/// period, which does not matter for speed. Every tp rank draws each full tensor and keeps its shard, so
/// the ranks of any tp size hold the same model as tp 1 with this seed (tp runs compare).
LlamaWeights random_llama_weights(const LlamaConfig& cfg, int tp_rank, int tp_size, Device device, DType dtype,
                                  uint64_t seed, float std = 0.02f);

/// Packs each layer's q/k/v projections (and biases) into qkv_proj / qkv_bias and gate/up into
/// gate_up_proj / gate_up_bias (this rank's rows, in that order: the tp split is unchanged), on the
/// weights' device and dtype, and makes q/k/v_proj, gate/up_proj and their biases views of the packed
/// rows, so no weight is held twice. Does nothing for a layer already packed.
void fuse_llama_projections(LlamaWeights& w);

/// Throws aerie::Error unless n_heads, n_kv_heads and intermediate_size divide by tp_size.
void check_tp_divisible(const LlamaConfig& cfg, int tp_size);

}  // namespace aerie
