// Internal to the model layer: the target's weights as this tp rank holds them, and their loading
// from a Hugging Face checkpoint (model.safetensors, or shards listed in model.safetensors.index.json).
#pragma once
#include <string>
#include <vector>

#include "core/tensor.h"
#include "model/llama_config.h"

namespace aerie {

/// One decoder layer, this rank's shard, all F32. nh = n_heads / tp, nkv = n_kv_heads / tp,
/// I_l = intermediate_size / tp (Megatron-LM: q/k/v/gate/up column-parallel, o/down row-parallel).
struct LlamaLayerWeights {
  Tensor input_layernorm, post_attention_layernorm;  // [H] (replicated)
  Tensor q_proj;                                     // [nh d, H]   rows of this rank's heads
  Tensor k_proj, v_proj;                             // [nkv d, H]
  Tensor o_proj;                                     // [H, nh d]   columns of this rank's heads
  Tensor gate_proj, up_proj;                         // [I_l, H]
  Tensor down_proj;                                  // [H, I_l]
};

struct LlamaWeights {
  Tensor embed_tokens;  // [V, H] F32, replicated on every tp rank
  Tensor lm_head;       // [V, H] F32, replicated; shares storage with embed_tokens when tied
  Tensor norm;          // [H] final_norm
  std::vector<LlamaLayerWeights> layers;
};

/// Loads `dir`'s weights (Hugging Face names: model.embed_tokens.weight, model.layers.{i}.self_attn.
/// {q,k,v,o}_proj.weight, model.layers.{i}.mlp.{gate,up,down}_proj.weight, model.layers.{i}.
/// {input,post_attention}_layernorm.weight, model.norm.weight, lm_head.weight unless tied), converted
/// to F32 and sharded for tp rank `tp_rank` of `tp_size`. Throws aerie::Error naming the file and tensor
/// on a missing or mis-shaped weight, on a tensor this Llama implementation would ignore (biases,
/// q_norm/k_norm: another architecture), and when heads, kv heads or intermediate_size are not
/// divisible by tp_size.
LlamaWeights load_llama_weights(const std::string& dir, const LlamaConfig& cfg, int tp_rank, int tp_size);

/// Throws aerie::Error unless n_heads, n_kv_heads and intermediate_size divide by tp_size.
void check_tp_divisible(const LlamaConfig& cfg, int tp_size);

}  // namespace aerie
