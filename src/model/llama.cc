// The target's forward (transformers' modeling_{llama,mistral,qwen2,qwen3}.py, *ForCausalLM), tensor
// parallel over the ranks of a tp group, with the captures of eagle3.md section 1 and a KV cache.
//
// Per layer l (residual stream r = r^l, [n, H] F32, identical on every tp rank):
//   h = input_layernorm(r); q, k, v = h Wq^T + bq, h Wk^T + bk, h Wv^T + bv   (this rank's heads;
//                                                                  biases: Qwen2, Llama attention_bias)
//   q, k = q_norm(q), k_norm(k) per head over head_dim                      (Qwen3 only)
//   q, k = RoPE(q, k) at positions p0 .. p0+n-1 (p0 = cache length)
//   r += all_reduce_sum(attention(q, [cache k; k], [cache v; v]) Wo^T) + bo (Wo: this rank's columns;
//        a sliding-window layer's query at p attends keys (p - W, p] only)
//   h = post_attention_layernorm(r)
//   r += all_reduce_sum((silu(h Wg^T + bg) * (h Wu^T + bu)) Wd^T) + bd       (this rank's I slice)
// then z = norm(r^N), logits = z W_lm^T. Every step is a kernels op on the weights' device; the
// tensors built here (ids, positions, a ones column for the bias GEMM) are moved to that device.
// Precision (LlamaModelOptions): in the BF16 mode r stays F32, h, q, k, v, the attention output, g and u
// are bf16 (GEMM inputs), and o_proj / down_proj write F32 into the residual add; every op accumulates
// in fp32. The F32 mode computes everything in fp32.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/device.h"
#include "core/error.h"
#include "core/log.h"
#include "kernels/activation.h"
#include "kernels/attention.h"
#include "kernels/convert.h"
#include "kernels/embedding.h"
#include "kernels/gemm.h"
#include "kernels/norm.h"
#include "kernels/optim.h"
#include "kernels/rope.h"
#include "model/llama.h"
#include "model/llama_weights.h"

#ifdef AERIE_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace aerie {

struct LlamaModel::Impl {
  Communicator* tp = nullptr;
  Device device = Device::CPU;
  DType dtype = DType::F32;  // compute dtype (weights, KV cache, GEMM inputs)
  LlamaWeights w;
  std::vector<float> inv_freq;
  int64_t nh = 0, nkv = 0, inter = 0;  // this rank's heads, kv heads, MLP width
};

namespace {

/// y += b broadcast over rows: y [n, M], b [M] or undefined (nothing to add), ones [n, 1] (all 1). A
/// K = 1 GEMM with beta 1 (y += ones b^T): one fp32 rounding per element, as a direct add, on any device.
void add_bias(Tensor& y, const Tensor& b, const Tensor& ones) {
  if (b.defined()) matmul(ones, b.reshape({1, b.dim(0)}), y, false, false, 1.0f, 1.0f);
}

/// y = x W^T + b: x [n, K], W [M, K], b [M] or undefined -> [n, M] of dtype `out` (x, W, b, ones: one dtype).
Tensor linear(const Tensor& x, const Tensor& W, const Tensor& b, const Tensor& ones, DType out) {
  Tensor y = Tensor::empty({x.dim(0), W.dim(0)}, out, x.device());
  matmul(x, W, y, false, true);
  add_bias(y, b, ones);
  return y;
}

Tensor rmsnorm(const Tensor& x, const Tensor& w, float eps, DType out) {
  Tensor y = Tensor::empty(x.shape(), out, x.device());
  Tensor rstd = Tensor::empty({x.dim(0)}, DType::F32, x.device());
  rmsnorm_forward(x, w, eps, y, &rstd);
  return y;
}

/// dst[:, col : col + src.cols] = src (row-major 2-D, one dtype and device).
void copy_columns(Tensor& dst, int64_t col, const Tensor& src) {
  AERIE_CHECK(dst.dtype() == src.dtype() && dst.device() == src.device() && dst.dim(0) == src.dim(0) &&
                  col + src.dim(1) <= dst.dim(1),
              "llama copy_columns: " << shape_str(src.shape()) << " into " << shape_str(dst.shape()) << " at " << col);
  const int64_t n = src.dim(0), c = src.dim(1), C = dst.dim(1);
  const size_t es = dtype_size(src.dtype());
  if (src.device() == Device::CPU) {
    const char* s = static_cast<const char*>(src.raw());
    char* d = static_cast<char*>(dst.raw());
    for (int64_t i = 0; i < n; ++i) std::memcpy(d + (i * C + col) * es, s + i * c * es, es * c);
    return;
  }
#ifdef AERIE_WITH_CUDA
  const cudaError_t e = cudaMemcpy2DAsync(static_cast<char*>(dst.raw()) + col * es, C * es, src.raw(), c * es, c * es,
                                          n, cudaMemcpyDeviceToDevice, static_cast<cudaStream_t>(cuda::current_stream()));
  AERIE_CHECK(e == cudaSuccess, "llama copy_columns: cudaMemcpy2DAsync: " << cudaGetErrorString(e));
#else
  AERIE_THROW("llama copy_columns: a CUDA tensor in a build without the CUDA backend");
#endif
}

/// Causal attention of q [n, nh, d] (positions p0 .. p0+n-1) over k_all, v_all [p0+n, nkv, d]; with
/// window W > 0 the query at position p attends keys p-W < j <= p only (transformers'
/// sliding_window_overlay). Rows whose window starts at key 0 go in one call, later rows one by one
/// over their W keys (a window longer than the sequence costs nothing).
void attend(const Tensor& q, const Tensor& k_all, const Tensor& v_all, int64_t p0, int64_t window, float scale,
            Tensor& out) {
  const int64_t n = q.dim(0);
  if (window <= 0 || p0 + n <= window) {
    attention_forward(q, k_all, v_all, p0, scale, out, nullptr);
    return;
  }
  const int64_t head = std::clamp<int64_t>(window - p0, 0, n);  // rows with p < W see keys 0..p
  if (head > 0) {
    Tensor o = out.slice(0, head);
    attention_forward(q.slice(0, head), k_all.slice(0, p0 + head), v_all.slice(0, p0 + head), p0, scale, o, nullptr);
  }
  for (int64_t t = head; t < n; ++t) {
    const int64_t p = p0 + t, lo = p - window + 1;
    Tensor o = out.slice(t, t + 1);
    attention_forward(q.slice(t, t + 1), k_all.slice(lo, p + 1), v_all.slice(lo, p + 1), window - 1, scale, o,
                      nullptr);
  }
}

}  // namespace

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
}

Device LlamaModel::device() const { return impl_->device; }
DType LlamaModel::dtype() const { return impl_->dtype; }
const Tensor& LlamaModel::embed_tokens() const { return impl_->w.embed_tokens; }
const Tensor& LlamaModel::lm_head() const { return impl_->w.lm_head; }
Communicator& LlamaModel::tp() const { return *impl_->tp; }
KVCache LlamaModel::make_cache(int64_t max_len) const {
  return KVCache(cfg_, max_len, impl_->tp->size(), impl_->device, impl_->dtype);
}

TargetOutput LlamaModel::forward(const std::vector<int32_t>& ids, KVCache* cache,
                                 const std::vector<int>& aux_layers, bool want_logits) {
  const Impl& m = *impl_;
  const int64_t n = static_cast<int64_t>(ids.size());
  const int64_t H = cfg_.hidden_size, d = cfg_.head_dim, N = cfg_.num_hidden_layers;
  const float eps = static_cast<float>(cfg_.rms_norm_eps);
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  AERIE_CHECK(n > 0, "LlamaModel::forward: empty ids");
  for (int a : aux_layers)
    AERIE_CHECK(a >= 0 && a <= N, "LlamaModel::forward: aux layer " << a << " outside [0, " << N << "]");
  const int64_t p0 = cache ? cache->length() : 0;
  if (cache) {
    AERIE_CHECK(static_cast<int64_t>(cache->k.size()) == N && cache->k[0].dim(1) == m.nkv && cache->k[0].dim(2) == d &&
                    cache->k[0].dtype() == m.dtype && cache->k[0].device() == m.device,
                "LlamaModel::forward: KV cache was made for another model, tp size, device or dtype");
    AERIE_CHECK(p0 + n <= cache->capacity(), "LlamaModel::forward: KV cache holds " << cache->capacity()
                                                 << " positions, " << p0 << " used, " << n << " more asked");
  }

  const Device dev = m.device;
  const DType ct = m.dtype;  // compute dtype: GEMM inputs, KV cache, captured outputs
  auto on_device = [dev](Tensor t) { return dev == Device::CPU ? t : t.to_device(dev); };
  Tensor ids_t = on_device(Tensor::from_vector(ids, {n}));
  std::vector<int32_t> pos(n);
  for (int64_t i = 0; i < n; ++i) pos[i] = static_cast<int32_t>(p0 + i);
  Tensor positions = on_device(Tensor::from_vector(pos, {n}));
  Tensor ones_f = Tensor::from_vector(std::vector<float>(static_cast<size_t>(n), 1.0f), {n, 1});
  Tensor ones = on_device(ct == DType::F32 ? ones_f : ones_f.to(ct));

  TargetOutput out;
  if (!aux_layers.empty())
    out.aux_hidden = Tensor::empty({n, H * static_cast<int64_t>(aux_layers.size())}, ct, dev);
  auto capture = [&](int64_t layer, const Tensor& r) {
    Tensor rc;  // r in the compute dtype, converted once per captured layer
    for (size_t j = 0; j < aux_layers.size(); ++j) {
      if (aux_layers[j] != layer) continue;
      if (!rc.defined()) {
        rc = ct == DType::F32 ? r : Tensor::empty(r.shape(), ct, dev);
        if (ct != DType::F32) convert(r, rc);
      }
      copy_columns(out.aux_hidden, static_cast<int64_t>(j) * H, rc);
    }
  };

  Tensor r = Tensor::empty({n, H}, DType::F32, dev);  // the residual stream r^l
  embedding_forward(ids_t, m.w.embed_tokens, r);
  Tensor attn = Tensor::empty({n, m.nh, d}, ct, dev);
  for (int64_t l = 0; l < N; ++l) {
    capture(l, r);
    const LlamaLayerWeights& L = m.w.layers[l];
    Tensor h = rmsnorm(r, L.input_layernorm, eps, ct);
    Tensor q = linear(h, L.q_proj, L.q_bias, ones, ct).reshape({n, m.nh, d});
    Tensor k = linear(h, L.k_proj, L.k_bias, ones, ct).reshape({n, m.nkv, d});
    Tensor v = linear(h, L.v_proj, L.v_bias, ones, ct).reshape({n, m.nkv, d});
    if (cfg_.qk_norm) {  // Qwen3: RMSNorm of every head vector, before RoPE
      q = rmsnorm(q.reshape({n * m.nh, d}), L.q_norm, eps, ct).reshape({n, m.nh, d});
      k = rmsnorm(k.reshape({n * m.nkv, d}), L.k_norm, eps, ct).reshape({n, m.nkv, d});
    }
    rope_apply(q, positions, m.inv_freq);
    rope_apply(k, positions, m.inv_freq);
    Tensor k_all = k, v_all = v;
    if (cache) {
      cache->k[l].slice(p0, p0 + n).copy_from(k);
      cache->v[l].slice(p0, p0 + n).copy_from(v);
      k_all = cache->k[l].slice(0, p0 + n);
      v_all = cache->v[l].slice(0, p0 + n);
    }
    attend(q, k_all, v_all, p0, cfg_.sliding_layers[l] ? cfg_.sliding_window : 0, scale, attn);
    Tensor o = linear(attn.reshape({n, m.nh * d}), L.o_proj, Tensor(), ones, DType::F32);  // [n, H], partial sum over tp ranks
    if (m.tp->size() > 1) m.tp->all_reduce_sum(o);
    add_bias(o, L.o_bias, ones);  // once, after the reduction
    add_inplace(r, o);

    h = rmsnorm(r, L.post_attention_layernorm, eps, ct);
    Tensor g = linear(h, L.gate_proj, L.gate_bias, ones, ct), u = linear(h, L.up_proj, L.up_bias, ones, ct);  // [n, I/tp]
    swiglu_forward(g, u, g);
    Tensor dn = linear(g, L.down_proj, Tensor(), ones, DType::F32);  // [n, H], partial sum over tp ranks
    if (m.tp->size() > 1) m.tp->all_reduce_sum(dn);
    add_bias(dn, L.down_bias, ones);
    add_inplace(r, dn);
  }
  capture(N, r);
  out.final_hidden = rmsnorm(r, m.w.norm, eps, ct);
  if (want_logits) out.logits = linear(out.final_hidden, m.w.lm_head, Tensor(), ones, DType::F32);
  if (cache) cache->length_ = p0 + n;
  return out;
}

// First version: one forward per sequence, outputs concatenated (same results as forward() by
// construction); the batched layer body replaces it.
TargetOutput LlamaModel::forward_batch(const std::vector<std::vector<int32_t>>& ids,
                                       const std::vector<KVCache*>& caches, const std::vector<int>& aux_layers,
                                       Logits logits) {
  AERIE_CHECK(!ids.empty(), "LlamaModel::forward_batch: empty batch");
  AERIE_CHECK(caches.empty() || caches.size() == ids.size(),
              "LlamaModel::forward_batch: " << caches.size() << " caches for " << ids.size() << " sequences");
  int64_t rows = 0;
  for (size_t b = 0; b < ids.size(); ++b) {
    AERIE_CHECK(!ids[b].empty(), "LlamaModel::forward_batch: sequence " << b << " is empty");
    rows += static_cast<int64_t>(ids[b].size());
  }
  std::vector<TargetOutput> parts;
  for (size_t b = 0; b < ids.size(); ++b)
    parts.push_back(forward(ids[b], caches.empty() ? nullptr : caches[b], aux_layers, logits != Logits::None));
  auto concat = [&](auto field, bool last_only) {
    const Tensor& t0 = parts[0].*field;
    if (!t0.defined()) return Tensor();
    Tensor out = Tensor::empty({last_only ? static_cast<int64_t>(ids.size()) : rows, t0.dim(1)}, t0.dtype(), t0.device());
    int64_t r = 0;
    for (const TargetOutput& p : parts) {
      const Tensor& t = p.*field;
      Tensor src = last_only ? t.slice(t.dim(0) - 1, t.dim(0)) : t;
      out.slice(r, r + src.dim(0)).copy_from(src);
      r += src.dim(0);
    }
    return out;
  };
  TargetOutput out;
  out.aux_hidden = concat(&TargetOutput::aux_hidden, false);
  out.final_hidden = concat(&TargetOutput::final_hidden, false);
  if (logits != Logits::None) out.logits = concat(&TargetOutput::logits, logits == Logits::Last);
  return out;
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
