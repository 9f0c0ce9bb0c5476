// Loading and tensor-parallel sharding of the target's weights (Megatron-LM, Shoeybi et al. 2019,
// section 3: column-parallel q/k/v/gate/up, row-parallel o/down). Embedding, lm_head and norms are
// replicated on every tp rank: the simplest layout, and what the EAGLE-3 pipeline needs (the draft
// reads the full embedding and lm_head); a vocabulary-parallel lm_head is a later optimisation.
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/log.h"
#include "io/safetensors.h"
#include "model/llama_weights.h"

namespace aerie {
namespace {

namespace fs = std::filesystem;

/// All tensors of the checkpoint by name, with the file each came from (for error messages).
struct Checkpoint {
  std::map<std::string, Tensor> tensors;
  std::map<std::string, std::string> file_of;
  std::set<std::string> used;

  const Tensor& get(const std::string& name, const Shape& shape) {
    auto it = tensors.find(name);
    AERIE_CHECK(it != tensors.end(), "checkpoint has no tensor \"" << name << "\"");
    it->second.check_shape(shape, file_of[name] + ": " + name);
    used.insert(name);
    return it->second;
  }
};

Checkpoint read_checkpoint(const std::string& dir) {
  Checkpoint ck;
  fs::path single = fs::path(dir) / "model.safetensors";
  fs::path index = fs::path(dir) / "model.safetensors.index.json";
  std::vector<std::string> files;
  if (fs::exists(single)) {
    files.push_back(single.string());
  } else if (fs::exists(index)) {
    std::ifstream in(index);
    AERIE_CHECK(in, "cannot open " << index.string());
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(in);
    } catch (const nlohmann::json::exception& e) {
      AERIE_THROW(index.string() << ": bad JSON: " << e.what());
    }
    AERIE_CHECK(j.contains("weight_map") && j["weight_map"].is_object(), index.string() << ": no weight_map");
    std::set<std::string> names;
    for (auto& [k, v] : j["weight_map"].items()) names.insert(v.get<std::string>());
    for (auto& n : names) files.push_back((fs::path(dir) / n).string());
  } else {
    AERIE_THROW("no model.safetensors or model.safetensors.index.json in " << dir);
  }
  for (auto& f : files) {
    SafetensorsFile sf = load_safetensors(f);
    for (auto& [name, t] : sf.tensors) {
      AERIE_CHECK(!ck.tensors.count(name), "tensor \"" << name << "\" appears in both " << ck.file_of[name]
                                                       << " and " << f);
      ck.tensors[name] = t;
      ck.file_of[name] = f;
    }
  }
  return ck;
}

Tensor to_f32(const Tensor& t) { return t.dtype() == DType::F32 ? t.clone() : t.to(DType::F32); }

/// Rows [r R/tp, (r+1) R/tp) of a [R, C] weight (column-parallel linear), as F32.
Tensor shard_rows(const Tensor& t, int rank, int size) {
  int64_t rows = t.dim(0) / size;
  return to_f32(t.slice(rank * rows, (rank + 1) * rows));
}

/// Columns [r C/tp, (r+1) C/tp) of a [R, C] weight (row-parallel linear), as F32.
Tensor shard_cols(const Tensor& t, int rank, int size) {
  Tensor full = t.dtype() == DType::F32 ? t : t.to(DType::F32);
  const int64_t R = t.dim(0), C = t.dim(1), c = C / size;
  Tensor out = Tensor::empty({R, c}, DType::F32);
  const float* src = full.data<float>();
  float* dst = out.data<float>();
  for (int64_t i = 0; i < R; ++i)
    std::copy(src + i * C + rank * c, src + i * C + (rank + 1) * c, dst + i * c);
  return out;
}

}  // namespace

void check_tp_divisible(const LlamaConfig& cfg, int tp_size) {
  AERIE_CHECK(tp_size >= 1, "tensor parallel size must be >= 1, got " << tp_size);
  AERIE_CHECK(cfg.num_attention_heads % tp_size == 0,
              "tp " << tp_size << " does not divide num_attention_heads " << cfg.num_attention_heads);
  AERIE_CHECK(cfg.num_key_value_heads % tp_size == 0,
              "tp " << tp_size << " does not divide num_key_value_heads " << cfg.num_key_value_heads
                    << " (aerie does not replicate kv heads)");
  AERIE_CHECK(cfg.intermediate_size % tp_size == 0,
              "tp " << tp_size << " does not divide intermediate_size " << cfg.intermediate_size);
}

LlamaWeights load_llama_weights(const std::string& dir, const LlamaConfig& cfg, int tp_rank, int tp_size) {
  check_tp_divisible(cfg, tp_size);
  Checkpoint ck = read_checkpoint(dir);
  const int64_t H = cfg.hidden_size, V = cfg.vocab_size, d = cfg.head_dim, I = cfg.intermediate_size;
  const int64_t nh = cfg.num_attention_heads, nkv = cfg.num_key_value_heads;

  LlamaWeights w;
  w.embed_tokens = to_f32(ck.get("model.embed_tokens.weight", {V, H}));
  w.norm = to_f32(ck.get("model.norm.weight", {H}));
  if (cfg.tie_word_embeddings) {
    w.lm_head = w.embed_tokens;
    // Some tied checkpoints still carry a copy; transformers ignores it, and so does aerie.
    if (ck.tensors.count("lm_head.weight")) ck.get("lm_head.weight", {V, H});
  } else {
    w.lm_head = to_f32(ck.get("lm_head.weight", {V, H}));
  }
  for (int64_t l = 0; l < cfg.num_hidden_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    LlamaLayerWeights L;
    L.input_layernorm = to_f32(ck.get(p + "input_layernorm.weight", {H}));
    L.post_attention_layernorm = to_f32(ck.get(p + "post_attention_layernorm.weight", {H}));
    L.q_proj = shard_rows(ck.get(p + "self_attn.q_proj.weight", {nh * d, H}), tp_rank, tp_size);
    L.k_proj = shard_rows(ck.get(p + "self_attn.k_proj.weight", {nkv * d, H}), tp_rank, tp_size);
    L.v_proj = shard_rows(ck.get(p + "self_attn.v_proj.weight", {nkv * d, H}), tp_rank, tp_size);
    L.o_proj = shard_cols(ck.get(p + "self_attn.o_proj.weight", {H, nh * d}), tp_rank, tp_size);
    L.gate_proj = shard_rows(ck.get(p + "mlp.gate_proj.weight", {I, H}), tp_rank, tp_size);
    L.up_proj = shard_rows(ck.get(p + "mlp.up_proj.weight", {I, H}), tp_rank, tp_size);
    L.down_proj = shard_cols(ck.get(p + "mlp.down_proj.weight", {H, I}), tp_rank, tp_size);
    w.layers.push_back(std::move(L));
  }
  // A tensor this implementation does not read (attention biases, q_norm/k_norm, extra layers) means
  // another architecture: computing without it would be silently wrong.
  for (auto& [name, t] : ck.tensors) {
    if (ck.used.count(name)) continue;
    if (name.size() >= 19 && name.compare(name.size() - 19, 19, "rotary_emb.inv_freq") == 0) continue;
    AERIE_THROW(ck.file_of[name] << ": tensor \"" << name << "\" " << shape_str(t.shape())
                                 << " is not part of a Llama decoder of this config (another architecture?)");
  }
  AERIE_LOG(debug) << "loaded " << ck.tensors.size() << " tensors from " << dir << " (tp rank " << tp_rank
                   << " of " << tp_size << ")";
  return w;
}

}  // namespace aerie
