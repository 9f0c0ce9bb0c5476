// TargetModel: building the layers from a WeightSource (a checkpoint, or random weights) by the
// architecture table, the KV cache and greedy decoding. The forward's scaffold is in decoder.cc.

#include <algorithm>
#include <sstream>

#include "core/error.h"
#include "core/gpu_limits.h"
#include "core/log.h"
#include "core/settings.h"
#include "model/target.h"
#include "model/arch.h"
#include "model/target_impl.h"
#include "model/weight_source.h"

namespace aerie {

KVCache::KVCache(const std::vector<Shape>& k_rows, const std::vector<Shape>& v_rows, int64_t max_len, Device device,
                 DType dtype) {
  AERIE_CHECK(max_len >= 0, "KVCache: negative max_len " << max_len);
  AERIE_CHECK(k_rows.size() == v_rows.size(), "KVCache: " << k_rows.size() << " K layers, " << v_rows.size() << " V");
  auto with_len = [max_len](Shape row) {
    row.insert(row.begin(), max_len);
    return row;
  };
  for (size_t l = 0; l < k_rows.size(); ++l) {
    k.push_back(Tensor::zeros(with_len(k_rows[l]), dtype, device));
    v.push_back(v_rows[l].empty() ? Tensor() : Tensor::zeros(with_len(v_rows[l]), dtype, device));
  }
  max_len_ = max_len;
}

void KVCache::truncate(int64_t len) {
  AERIE_CHECK(len >= 0 && len <= length_, "KVCache::truncate(" << len << "): cache holds " << length_);
  length_ = len;
}

void KVCache::keep_rows(int64_t from, const std::vector<int64_t>& rows) {
  AERIE_CHECK(from >= 0 && from <= length_, "KVCache::keep_rows: from " << from << ", cache holds " << length_);
  for (size_t j = 0; j < rows.size(); ++j)
    AERIE_CHECK(rows[j] >= static_cast<int64_t>(j) && (j == 0 || rows[j] > rows[j - 1]) && from + rows[j] < length_,
                "KVCache::keep_rows: row " << rows[j] << " (entry " << j << ") is not ascending or past the cache's "
                                           << length_ - from << " rows");
  // Ascending rows with rows[j] >= j: every source lies at or after its destination and after every
  // destination written before it, so copying in order never reads an overwritten row.
  for (size_t j = 0; j < rows.size(); ++j) {
    if (rows[j] == static_cast<int64_t>(j)) continue;
    const int64_t dst = from + static_cast<int64_t>(j), src = from + rows[j];
    for (size_t l = 0; l < k.size(); ++l) {
      k[l].slice(dst, dst + 1).copy_from(k[l].slice(src, src + 1));
      if (v[l].defined()) v[l].slice(dst, dst + 1).copy_from(v[l].slice(src, src + 1));
    }
  }
  length_ = from + static_cast<int64_t>(rows.size());
}

TargetModel::TargetModel(const std::string& dir, Communicator& tp) : TargetModel(dir, tp, TargetModelOptions{}) {}

TargetModel::TargetModel(const std::string& dir, Communicator& tp, const TargetModelOptions& options)
    : impl_(std::make_shared<Impl>()), cfg_(load_target_config(dir)) {
  auto src = checkpoint_weights(dir, tp.rank(), tp.size(), options.device, options.dtype, cfg_.quant);
  build(*src, tp, options);
  src->finish("a " + cfg_.model_type + " decoder of this config");
  AERIE_LOG(debug) << "loaded the " << cfg_.model_type << " weights of " << dir << " (tp rank " << tp.rank() << " of "
                   << tp.size() << ")";
}

TargetModel TargetModel::random(const TargetConfig& cfg, Communicator& tp, const TargetModelOptions& options,
                                uint64_t seed) {
  TargetModel m;
  m.impl_ = std::make_shared<Impl>();
  m.cfg_ = cfg;
  auto src = random_weights(seed, tp.rank(), tp.size(), options.device, options.dtype, 0.02f, cfg.quant);
  m.build(*src, tp, options);
  src->finish("random weights");
  return m;
}

TargetWeights build_target_weights(WeightSource& src, const TargetConfig& cfg) {
  const Architecture& arch = find_architecture(cfg.model_type, "TargetModel");
  TargetWeights w;
  const std::string& P = src.decoder_prefix();
  const int64_t H = cfg.hidden_size, V = cfg.vocab_size;
  w.embed_tokens = src.load(P + "embed_tokens.weight", {V, H}, TpSplit::None, ParamRole::Embedding);
  w.norm = src.load(P + "norm.weight", {H}, TpSplit::None, ParamRole::Norm);
  for (int64_t l = 0; l < cfg.num_hidden_layers; ++l) {
    WeightSource::Scope layer(src, l);
    w.layers.push_back(arch.build_layer(src, cfg, l));
  }
  // DeepSeek-V3's multi-token-prediction layers follow the decoder's (model.layers.61.*): not part of
  // the forward, skipped.
  for (int64_t l = 0; l < cfg.num_nextn_predict_layers; ++l) {
    const std::string mtp = P + "layers." + std::to_string(cfg.num_hidden_layers + l) + ".";
    w.mtp_skipped.emplace_back(mtp, src.skip_prefix(mtp, "MTP layer: num_nextn_predict_layers"));
  }
  // Some tied checkpoints still carry an lm_head copy; transformers ignores it, and so does aerie.
  const std::string lm_head = src.has("lm_head.weight") || !src.has("language_model.lm_head.weight")
                                  ? "lm_head.weight"
                                  : "language_model.lm_head.weight";
  if (cfg.tie_word_embeddings) {
    w.lm_head = w.embed_tokens;
    if (src.has(lm_head)) src.skip(lm_head, {V, H});
  } else {
    AERIE_CHECK(src.has(lm_head), "no tensor \"lm_head.weight\" in the checkpoint and tie_word_embeddings is false");
    w.lm_head = src.load(lm_head, {V, H}, TpSplit::None, ParamRole::Embedding);
  }
  return w;
}

void TargetModel::build(WeightSource& src, Communicator& tp, const TargetModelOptions& options) {
  Impl& m = *impl_;
  src.set_expert_parallel(options.expert_parallel);
  src.set_fp8_gemm(options.fp8_gemm);
  m.tp = &tp;
  m.device = options.device;
  m.dtype = options.dtype;
  m.tp_overlap = options.tp_overlap;
  TargetWeights w = build_target_weights(src, cfg_);
  m.embed_tokens = std::move(w.embed_tokens);
  m.norm = std::move(w.norm);
  m.layers = std::move(w.layers);
  m.lm_head = std::move(w.lm_head);
  for (const auto& [mtp, skipped] : w.mtp_skipped)
    if (skipped > 0) AERIE_LOG(info) << "skipped the " << skipped << " tensors of the MTP layer " << mtp << "*";
  if (options.fp8_gemm && log_rank() == 0) {  // say what --fp8-gemm did, and what it left as it was
    const WeightSource::Fp8GemmCounts& c = src.fp8_gemm_counts();
    std::ostringstream os;
    os << "--fp8-gemm: " << c.switched << " linears hold block-FP8 weights (" << c.quantized
       << " of them quantized at load from " << dtype_name(options.dtype) << ") and run W8A8 GEMMs";
    if (cfg_.moe.n_routed_experts > 0) os << ", but for the routed experts (their grouped GEMM: BF16 activations)";
    if (c.int4 > 0) os << "; " << c.int4 << " INT4 linears keep their own GEMM";
    if (c.misaligned > 0)
      os << "; " << c.misaligned << " block-FP8 linears whose tp " << tp.size()
         << " slice starts inside a 128-block keep the dequantizing path";
    AERIE_LOG(info) << os.str();
    if (options.device == Device::CUDA && cuda::fp8_gemm_runs_mma(cuda::gpu_limits(), settings().fp8_gemm_kernel))
      AERIE_LOG(warning) << "--fp8-gemm on this GPU runs aerie's mma.sync e4m3 GEMM (its cuBLASLt has no block-scaled "
                            "FP8): measured 3x slower than BF16 GEMMs (docs/performance.md); it saves the weights' "
                            "memory, not time. Leave --fp8-gemm out where the BF16 target fits.";
  }
  m.profile.enable(OpProfile::enabled_by_env());
  if (options.expert_parallel && tp.rank() == 0) {  // say what --expert-parallel did (or that it did nothing)
    int64_t moe_layers = 0;
    for (int64_t l = 0; l < cfg_.num_hidden_layers; ++l) moe_layers += cfg_.moe.is_moe_layer(l);
    const int64_t E = cfg_.moe.n_routed_experts;
    if (moe_layers == 0)
      AERIE_LOG(warning) << "--expert-parallel: " << cfg_.model_type << " has no routed experts: nothing to split";
    else if (tp.size() == 1)
      AERIE_LOG(warning) << "--expert-parallel at tp 1: one rank holds every expert; nothing to split";
    else
      AERIE_LOG(info) << "expert parallelism: the " << E << " routed experts of each of the " << moe_layers
                      << " MoE layers split over tp " << tp.size() << ", " << E / tp.size()
                      << " whole experts per rank (rank r holds experts [" << E / tp.size() << " r, "
                      << E / tp.size() << " (r + 1)))";
  }
}

Device TargetModel::device() const { return impl_->device; }
DType TargetModel::dtype() const { return impl_->dtype; }
const Tensor& TargetModel::embed_tokens() const { return impl_->embed_tokens; }
const Tensor& TargetModel::lm_head() const { return impl_->lm_head; }
Communicator& TargetModel::tp() const { return *impl_->tp; }
std::string TargetModel::profile_summary() const { return impl_->profile.summary(); }
KVCache TargetModel::make_cache(int64_t max_len) const {
  std::vector<Shape> k_rows, v_rows;
  for (const DecoderLayer& L : impl_->layers) {
    k_rows.push_back(L.attn->cache_k_row());
    v_rows.push_back(L.attn->cache_v_row());
  }
  return KVCache(k_rows, v_rows, max_len, impl_->device, impl_->dtype);
}

std::vector<int32_t> greedy_generate(TargetModel& model, const std::vector<int32_t>& prompt, int64_t max_new,
                                     int32_t stop_id) {
  return greedy_generate(model, prompt, max_new, stop_id >= 0 ? std::vector<int32_t>{stop_id} : std::vector<int32_t>{});
}

std::vector<int32_t> greedy_generate(TargetModel& model, const std::vector<int32_t>& prompt, int64_t max_new,
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

std::function<void(const std::vector<int32_t>&, Tensor&, Tensor&)> TargetModel::hidden_states_forward(
    std::vector<int> aux_layers) {
  return [this, aux = std::move(aux_layers)](const std::vector<int32_t>& ids, Tensor& a, Tensor& fin) {
    TargetOutput out = forward(ids, nullptr, aux, false);
    a = out.aux_hidden;
    fin = out.final_hidden;
  };
}

std::function<void(const std::vector<std::vector<int32_t>>&, Tensor&, Tensor&)> TargetModel::hidden_states_forward_batch(
    std::vector<int> aux_layers) {
  return [this, aux = std::move(aux_layers)](const std::vector<std::vector<int32_t>>& ids, Tensor& a, Tensor& fin) {
    TargetOutput out = forward_batch(ids, {}, aux, Logits::None);
    a = out.aux_hidden;
    fin = out.final_hidden;
  };
}

}  // namespace aerie
