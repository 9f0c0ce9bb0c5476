// Loading and tensor-parallel sharding of the target's weights (Megatron-LM, Shoeybi et al. 2019,
// section 3: column-parallel q/k/v/gate/up with their biases, row-parallel o/down whose biases are
// added once after the all-reduce). Embedding, lm_head and norms (incl. Qwen3's q_norm/k_norm over
// head_dim) are replicated on every tp rank: the simplest layout, and what the EAGLE-3 pipeline needs
// (the draft reads the full embedding and lm_head); a vocabulary-parallel lm_head is a later optimisation.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "core/device.h"
#include "core/error.h"
#include "core/log.h"
#include "kernels/tensor_ops.h"
#include "model/llama_weights.h"

namespace aerie {

namespace fs = std::filesystem;

namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

HfCheckpoint::HfCheckpoint(const std::string& dir) : dir_(dir) {
  const fs::path single = fs::path(dir) / "model.safetensors";
  const fs::path index = fs::path(dir) / "model.safetensors.index.json";
  if (fs::exists(single)) {
    files_.push_back(std::make_unique<SafetensorsReader>(single.string()));
    for (const auto& [name, e] : files_.back()->entries()) where_[name] = files_.back().get();
  } else if (fs::exists(index)) {
    index_path_ = index.string();
    std::ifstream in(index);
    AERIE_CHECK(in, "cannot open " << index_path_);
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(in);
    } catch (const nlohmann::json::exception& e) {
      AERIE_THROW(index_path_ << ": bad JSON: " << e.what());
    }
    AERIE_CHECK(j.is_object() && j.contains("weight_map") && j["weight_map"].is_object(),
                index_path_ << ": no weight_map object");
    std::map<std::string, std::vector<std::string>> names_of;  // shard -> tensors the index puts there
    for (const auto& [name, file] : j["weight_map"].items()) {
      AERIE_CHECK(file.is_string(), index_path_ << ": weight_map[\"" << name << "\"] is not a file name");
      names_of[file.get<std::string>()].push_back(name);
    }
    for (const auto& [file, names] : names_of) {
      const fs::path p = fs::path(dir) / file;
      AERIE_CHECK(fs::exists(p), index_path_ << " names shard " << file << " (for \"" << names.front()
                                             << "\"), which does not exist in " << dir);
      files_.push_back(std::make_unique<SafetensorsReader>(p.string()));
      const SafetensorsReader* r = files_.back().get();
      for (const auto& n : names)
        AERIE_CHECK(r->contains(n), index_path_ << " puts tensor \"" << n << "\" in " << r->path()
                                                << ", which has no such tensor");
      for (const auto& [name, e] : r->entries()) {
        auto it = where_.find(name);
        AERIE_CHECK(it == where_.end(), "tensor \"" << name << "\" appears in both " << it->second->path()
                                                    << " and " << r->path());
        where_[name] = r;
      }
    }
  } else {
    AERIE_THROW("no model.safetensors or model.safetensors.index.json in " << dir);
  }
  for (const char* p : {"model.", "model.language_model.", "language_model.model."}) {
    if (contains(std::string(p) + "embed_tokens.weight")) {
      prefix_ = p;
      break;
    }
  }
  AERIE_CHECK(!prefix_.empty(), file_of("model.embed_tokens.weight")
                                    << ": no tensor \"model.embed_tokens.weight\" (nor under a multimodal "
                                       "wrapper's model.language_model. or language_model.model.)");
  for (const char* n : {"lm_head.weight", "language_model.lm_head.weight"}) {
    if (contains(n)) {
      lm_head_ = n;
      break;
    }
  }
  if (prefix_ != "model.") AERIE_LOG(info) << dir << ": language model found under \"" << prefix_ << "\"";
}

std::string HfCheckpoint::file_of(const std::string& name) const {
  auto it = where_.find(name);
  if (it != where_.end()) return it->second->path();
  if (!index_path_.empty()) return index_path_ + " (and its shards)";
  return files_.empty() ? dir_ : files_.front()->path();
}

Shape HfCheckpoint::shape_of(const std::string& name) const {
  auto it = where_.find(name);
  AERIE_CHECK(it != where_.end(), file_of(name) << ": no tensor \"" << name << "\"");
  return it->second->entries().at(name).shape;
}

Tensor HfCheckpoint::get(const std::string& name, const Shape& shape, int64_t begin, int64_t end) {
  auto it = where_.find(name);
  AERIE_CHECK(it != where_.end(), file_of(name) << ": no tensor \"" << name << "\"");
  const SafetensorsReader& r = *it->second;
  const SafetensorsEntry& e = r.entries().at(name);
  bool ok = e.shape.size() == shape.size();
  for (size_t i = 0; ok && i < shape.size(); ++i) ok = e.shape[i] == shape[i];
  AERIE_CHECK(ok, r.path() << ": tensor \"" << name << "\": expected shape " << shape_str(shape) << ", got "
                           << shape_str(e.shape));
  AERIE_CHECK(e.dtype == DType::F32 || e.dtype == DType::BF16 || e.dtype == DType::F16,
              r.path() << ": tensor \"" << name << "\" is " << dtype_name(e.dtype) << ", not F32, BF16 or F16");
  read_.insert(name);
  Tensor t = end >= 0 ? r.read_rows(name, begin, end) : r.read(name);
  return t.dtype() == DType::F32 ? t : t.to(DType::F32);
}

std::vector<std::string> HfCheckpoint::unread_language_model_tensors() const {
  std::vector<std::string> out;
  for (const auto& [name, r] : where_) {
    if (read_.count(name) || ends_with(name, "rotary_emb.inv_freq")) continue;
    const bool lm = name.compare(0, prefix_.size(), prefix_) == 0 || name == "lm_head.weight" ||
                    name == "language_model.lm_head.weight" || prefix_ == "model.";
    if (lm) out.push_back(name);
  }
  return out;
}

namespace {

/// Columns [r C/tp, (r+1) C/tp) of a [R, C] F32 weight (row-parallel linear).
Tensor shard_cols(const Tensor& full, int rank, int size) {
  const int64_t R = full.dim(0), C = full.dim(1), c = C / size;
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
  HfCheckpoint ck(dir);
  const std::string& P = ck.decoder_prefix();
  const int64_t H = cfg.hidden_size, V = cfg.vocab_size, d = cfg.head_dim, I = cfg.intermediate_size;
  const int64_t nh = cfg.num_attention_heads, nkv = cfg.num_key_value_heads;
  const int r = tp_rank, s = tp_size;
  // Rows of this rank's shard of a column-parallel weight or bias of `rows` rows.
  auto rows = [&](const std::string& name, const Shape& shape) {
    const int64_t n = shape[0] / s;
    return ck.get(name, shape, r * n, (r + 1) * n);
  };

  LlamaWeights w;
  w.embed_tokens = ck.get(P + "embed_tokens.weight", {V, H});
  w.norm = ck.get(P + "norm.weight", {H});
  if (cfg.tie_word_embeddings) {
    w.lm_head = w.embed_tokens;
    // Some tied checkpoints still carry a copy; transformers ignores it, and so does aerie.
    if (!ck.lm_head_name().empty()) ck.get(ck.lm_head_name(), {V, H});
  } else {
    AERIE_CHECK(!ck.lm_head_name().empty(), ck.file_of("lm_head.weight")
                                                << ": no tensor \"lm_head.weight\" and tie_word_embeddings is false");
    w.lm_head = ck.get(ck.lm_head_name(), {V, H});
  }
  for (int64_t l = 0; l < cfg.num_hidden_layers; ++l) {
    const std::string p = P + "layers." + std::to_string(l) + ".";
    const std::string a = p + "self_attn.", m = p + "mlp.";
    LlamaLayerWeights L;
    L.input_layernorm = ck.get(p + "input_layernorm.weight", {H});
    L.post_attention_layernorm = ck.get(p + "post_attention_layernorm.weight", {H});
    L.q_proj = rows(a + "q_proj.weight", {nh * d, H});
    L.k_proj = rows(a + "k_proj.weight", {nkv * d, H});
    L.v_proj = rows(a + "v_proj.weight", {nkv * d, H});
    L.o_proj = shard_cols(ck.get(a + "o_proj.weight", {H, nh * d}), r, s);
    L.gate_proj = rows(m + "gate_proj.weight", {I, H});
    L.up_proj = rows(m + "up_proj.weight", {I, H});
    L.down_proj = shard_cols(ck.get(m + "down_proj.weight", {H, I}), r, s);
    if (cfg.qkv_bias) {
      L.q_bias = rows(a + "q_proj.bias", {nh * d});
      L.k_bias = rows(a + "k_proj.bias", {nkv * d});
      L.v_bias = rows(a + "v_proj.bias", {nkv * d});
    }
    if (cfg.o_bias) L.o_bias = ck.get(a + "o_proj.bias", {H});
    if (cfg.mlp_bias) {
      L.gate_bias = rows(m + "gate_proj.bias", {I});
      L.up_bias = rows(m + "up_proj.bias", {I});
      L.down_bias = ck.get(m + "down_proj.bias", {H});
    }
    if (cfg.qk_norm) {
      L.q_norm = ck.get(a + "q_norm.weight", {d});
      L.k_norm = ck.get(a + "k_norm.weight", {d});
    }
    w.layers.push_back(std::move(L));
  }
  // A language-model tensor this implementation does not read (a bias or q_norm the config does not
  // announce, extra layers) means another architecture: computing without it would be silently wrong.
  for (const auto& name : ck.unread_language_model_tensors())
    AERIE_THROW(ck.file_of(name) << ": tensor \"" << name << "\" " << shape_str(ck.shape_of(name))
                                 << " is not part of a " << cfg.model_type
                                 << " decoder of this config (another architecture, or a config field missing?)");
  AERIE_LOG(debug) << "loaded the " << cfg.model_type << " weights of " << dir << " (tp rank " << tp_rank << " of "
                   << tp_size << ")";
  return w;
}

namespace {

// Every tensor of a LlamaWeights with its role: f(tensor, is_norm). Order fixed (used for seeds).
template <typename F>
void for_each_weight(LlamaWeights& w, F&& f) {
  f(w.embed_tokens, false);
  f(w.norm, true);
  for (auto& L : w.layers) {
    f(L.input_layernorm, true);
    f(L.post_attention_layernorm, true);
    for (Tensor* t : {&L.q_proj, &L.k_proj, &L.v_proj, &L.o_proj, &L.gate_proj, &L.up_proj, &L.down_proj,
                      &L.q_bias, &L.k_bias, &L.v_bias, &L.o_bias, &L.gate_bias, &L.up_bias, &L.down_bias})
      f(*t, false);
    f(L.q_norm, true);
    f(L.k_norm, true);
  }
}

uint64_t splitmix64(uint64_t& s) {
  uint64_t z = (s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

}  // namespace

LlamaWeights llama_weights_to(LlamaWeights w, Device device, DType dtype) {
  AERIE_CHECK(dtype == DType::F32 || dtype == DType::BF16,
              "llama_weights_to: compute dtype must be F32 or BF16, got " << dtype_name(dtype));
  const bool tied = w.lm_head.raw() == w.embed_tokens.raw();
  if (tied) w.lm_head = Tensor();
  auto move = [&](Tensor& t, bool is_norm) {
    if (!t.defined()) return;
    Tensor c = (!is_norm && t.dtype() != dtype) ? t.to(dtype) : t;
    t = Tensor();  // release the host F32 copy before the next tensor
    t = c.device() == device ? c : c.to_device(device);
  };
  for_each_weight(w, move);
  if (tied) {
    w.lm_head = w.embed_tokens;
  } else {
    move(w.lm_head, false);
  }
  return w;
}

LlamaWeights random_llama_weights(const LlamaConfig& cfg, int tp_rank, int tp_size, Device device, DType dtype,
                                  uint64_t seed, float std) {
  check_tp_divisible(cfg, tp_size);
  AERIE_CHECK(dtype == DType::F32 || dtype == DType::BF16,
              "random_llama_weights: compute dtype must be F32 or BF16, got " << dtype_name(dtype));
  const int64_t H = cfg.hidden_size, V = cfg.vocab_size, d = cfg.head_dim;
  const int64_t nh = cfg.num_attention_heads / tp_size, nkv = cfg.num_key_value_heads / tp_size;
  const int64_t I = cfg.intermediate_size / tp_size;
  LlamaWeights w;
  auto mk = [&](const Shape& s) { return Tensor::empty(s, dtype, device); };
  auto norm = [&](int64_t n) { return Tensor::empty({n}, DType::F32, device); };
  w.embed_tokens = mk({V, H});
  w.norm = norm(H);
  for (int64_t l = 0; l < cfg.num_hidden_layers; ++l) {
    LlamaLayerWeights L;
    L.input_layernorm = norm(H);
    L.post_attention_layernorm = norm(H);
    L.q_proj = mk({nh * d, H});
    L.k_proj = mk({nkv * d, H});
    L.v_proj = mk({nkv * d, H});
    L.o_proj = mk({H, nh * d});
    L.gate_proj = mk({I, H});
    L.up_proj = mk({I, H});
    L.down_proj = mk({H, I});
    if (cfg.qkv_bias) {
      L.q_bias = mk({nh * d});
      L.k_bias = mk({nkv * d});
      L.v_bias = mk({nkv * d});
    }
    if (cfg.o_bias) L.o_bias = mk({H});
    if (cfg.mlp_bias) {
      L.gate_bias = mk({I});
      L.up_bias = mk({I});
      L.down_bias = mk({H});
    }
    if (cfg.qk_norm) {
      L.q_norm = norm(d);
      L.k_norm = norm(d);
    }
    w.layers.push_back(std::move(L));
  }

  // The pool: 2P normal values (P odd-sized so that rows of a tensor do not repeat in step), uploaded
  // once; a tensor of n values is the windows [o, o + P) of the pool repeated, o per tensor.
  constexpr int64_t P = (int64_t{1} << 22) + 4099;
  uint64_t s = seed * 0x2545F4914F6CDD1Dull + 1;
  std::vector<float> pool(2 * P);
  for (int64_t i = 0; i < 2 * P; i += 2) {  // Box-Muller: two normals from two uniforms in (0, 1]
    const double u1 = (static_cast<double>(splitmix64(s) >> 11) + 1.0) * 0x1.0p-53;
    const double u2 = static_cast<double>(splitmix64(s) >> 11) * 0x1.0p-53;
    const double r = std::sqrt(-2.0 * std::log(u1)) * std;
    pool[i] = static_cast<float>(r * std::cos(2.0 * M_PI * u2));
    pool[i + 1] = static_cast<float>(r * std::sin(2.0 * M_PI * u2));
  }
  Tensor pool_t = Tensor::from_vector(pool, {2 * P});
  if (dtype != DType::F32) pool_t = pool_t.to(dtype);
  if (device != Device::CPU) pool_t = pool_t.to_device(device);
  Tensor ones_h = Tensor::from_vector(std::vector<float>(static_cast<size_t>(std::max(H, d)), 1.0f), {std::max(H, d)});
  Tensor ones = device == Device::CPU ? ones_h : ones_h.to_device(device);

  auto fill = [&](Tensor& t, bool is_norm) {
    if (!t.defined()) return;
    Tensor flat = t.reshape({t.numel()});
    if (is_norm) {
      flat.copy_from(ones.slice(0, t.numel()));
      return;
    }
    if (t.ndim() == 1) {  // a bias
      flat.fill_zero();
      return;
    }
    int64_t o = static_cast<int64_t>(splitmix64(s) % static_cast<uint64_t>(P));
    for (int64_t i = 0; i < t.numel(); i += P) {
      const int64_t n = std::min(P, t.numel() - i);
      flat.slice(i, i + n).copy_from(pool_t.slice(o, o + n));
      o = (o + 7919) % P;  // the next window starts elsewhere
    }
  };
  // Tensor parallel: every rank draws the FULL tensor (same offsets in the same order on every rank)
  // and keeps its shard, so that tp ranks together hold the one model a tp-1 run makes from `seed`
  // (tp runs can be compared). split: 0 rows (column-parallel q/k/v/gate/up), 1 columns (row-parallel
  // o/down), -1 none.
  const int64_t r = tp_rank;
  auto fill_split = [&](Tensor& t, int split) {
    if (!t.defined() || t.ndim() != 2 || split < 0 || tp_size == 1) {
      fill(t, false);
      return;
    }
    Shape full_shape = t.shape();
    full_shape[split] *= tp_size;
    Tensor full = Tensor::empty(full_shape, t.dtype(), t.device());
    fill(full, false);
    if (split == 0)
      t.copy_from(full.slice(r * t.dim(0), (r + 1) * t.dim(0)));
    else
      copy_columns(full, r * t.dim(1), t, 0, t.dim(1));
  };
  fill(w.embed_tokens, false);
  fill(w.norm, true);
  for (auto& L : w.layers) {
    fill(L.input_layernorm, true);
    fill(L.post_attention_layernorm, true);
    for (Tensor* t : {&L.q_proj, &L.k_proj, &L.v_proj}) fill_split(*t, 0);
    fill_split(L.o_proj, 1);
    for (Tensor* t : {&L.gate_proj, &L.up_proj}) fill_split(*t, 0);
    fill_split(L.down_proj, 1);
    for (Tensor* t : {&L.q_bias, &L.k_bias, &L.v_bias, &L.o_bias, &L.gate_bias, &L.up_bias, &L.down_bias})
      fill(*t, false);  // zeros
    fill(L.q_norm, true);
    fill(L.k_norm, true);
  }
  if (cfg.tie_word_embeddings) {
    w.lm_head = w.embed_tokens;
  } else {
    w.lm_head = mk({V, H});
    fill(w.lm_head, false);
  }
  if (device != Device::CPU) cuda::synchronize();  // the pool is freed when this returns
  return w;
}

namespace {

/// The rows of `parts` (2-D [r_i, C] or 1-D [r_i], one dtype and device) stacked into one tensor;
/// each part is replaced by a view of its rows in it. Undefined parts: nothing is packed.
Tensor pack_rows(const std::vector<Tensor*>& parts) {
  for (const Tensor* p : parts)
    if (!p->defined()) return Tensor();
  Shape shape = parts[0]->shape();
  int64_t rows = 0;
  for (const Tensor* p : parts) rows += p->dim(0);
  shape[0] = rows;
  Tensor packed = Tensor::empty(shape, parts[0]->dtype(), parts[0]->device());
  int64_t r = 0;
  for (Tensor* p : parts) {
    Tensor view = packed.slice(r, r + p->dim(0));
    view.copy_from(*p);
    r += p->dim(0);
    *p = view;
  }
  return packed;
}

}  // namespace

void fuse_llama_projections(LlamaWeights& w) {
  for (LlamaLayerWeights& L : w.layers) {
    if (L.qkv_proj.defined()) continue;
    L.qkv_proj = pack_rows({&L.q_proj, &L.k_proj, &L.v_proj});
    L.qkv_bias = pack_rows({&L.q_bias, &L.k_bias, &L.v_bias});
    L.gate_up_proj = pack_rows({&L.gate_proj, &L.up_proj});
    L.gate_up_bias = pack_rows({&L.gate_bias, &L.up_bias});
  }
}

}  // namespace aerie
