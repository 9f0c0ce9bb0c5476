// The target's forward (transformers' modeling_{llama,mistral,qwen2,qwen3}.py, *ForCausalLM), tensor
// parallel over the ranks of a tp group, with the captures of eagle3.md section 1 and a KV cache, over
// a batch of B sequences whose rows are concatenated (n = sum n_b rows; forward() is B = 1).
//
// Per layer l (residual stream r = r^l, [n, H] F32, identical on every tp rank):
//   h = input_layernorm(r); q, k, v = h Wq^T + bq, h Wk^T + bk, h Wv^T + bv   (this rank's heads;
//                                                                  biases: Qwen2, Llama attention_bias)
//   q, k = q_norm(q), k_norm(k) per head over head_dim                      (Qwen3 only)
//   q, k = RoPE(q, k) at positions p0_b .. p0_b+n_b-1 of each sequence (p0_b = its cache length)
//   r += all_reduce_sum(attention(q, [cache k; k], [cache v; v]) Wo^T) + bo (Wo: this rank's columns;
//        each sequence attends its own keys only; a sliding-window layer's query at p attends keys
//        (p - W, p] only)
//   h = post_attention_layernorm(r)
//   r += all_reduce_sum((silu(h Wg^T + bg) * (h Wu^T + bu)) Wd^T) + bd       (this rank's I slice)
// then z = norm(r^N), logits = z W_lm^T (all rows, or the last row of each sequence). Every step is a
// kernels op on the weights' device; the tensors built here (ids, positions, sequence boundaries, a
// ones column for the bias GEMM) are moved to that device.
// Fused ops (kernels/fused.h; weights packed by fuse_llama_projections at load): one GEMM for q/k/v
// ([n, (nh + 2 nkv) d]) and qkv_rope_forward for the split, q/k norm and RoPE (k and v written into the
// KV cache's slots directly for a single cached sequence); one GEMM for gate/up ([n, 2 I]) and
// swiglu_packed_forward; every residual add fused with the RMSNorm that follows it (add_rmsnorm_forward:
// post_attention_layernorm, the next layer's input_layernorm, after the last layer final_norm).
// Precision (LlamaModelOptions): in the BF16 mode r stays F32, h, q, k, v, the attention output, g and u
// are bf16 (GEMM inputs), and o_proj / down_proj write F32 into the residual add; every op accumulates
// in fp32. The F32 mode computes everything in fp32 (the fused ops give the unfused ops' fp32 results
// on the CPU). Profiling: every op is timed by category when AERIE_PROFILE=1 (model/op_profile.h).
#include <algorithm>
#include <cmath>
#include <set>

#include "core/device.h"
#include "core/error.h"
#include "kernels/attention.h"
#include "kernels/convert.h"
#include "kernels/embedding.h"
#include "kernels/fused.h"
#include "kernels/gemm.h"
#include "kernels/norm.h"
#include "kernels/tensor_ops.h"
#include "model/llama.h"
#include "model/llama_impl.h"
#include "model/op_profile.h"

namespace aerie {

namespace {

/// y += b broadcast over rows: y [n, M], b [M] or undefined (nothing to add), ones [n, 1] (all 1). A
/// K = 1 GEMM with beta 1 (y += ones b^T): one fp32 rounding per element, as a direct add, on any device.
void add_bias(Tensor& y, const Tensor& b, const Tensor& ones) {
  if (b.defined()) matmul(ones, b.reshape({1, b.dim(0)}), y, false, false, 1.0f, 1.0f);
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

TargetOutput LlamaModel::forward(const std::vector<int32_t>& ids, KVCache* cache,
                                 const std::vector<int>& aux_layers, bool want_logits) {
  return run({ids}, {cache}, aux_layers, want_logits ? Logits::All : Logits::None, "LlamaModel::forward");
}

TargetOutput LlamaModel::forward_batch(const std::vector<std::vector<int32_t>>& ids,
                                       const std::vector<KVCache*>& caches, const std::vector<int>& aux_layers,
                                       Logits logits) {
  return run(ids, caches, aux_layers, logits, "LlamaModel::forward_batch");
}

TargetOutput LlamaModel::run(const std::vector<std::vector<int32_t>>& ids, const std::vector<KVCache*>& caches,
                             const std::vector<int>& aux_layers, Logits logits, const char* who) {
  Impl& m = *impl_;
  OpProfile& prof = m.profile;
  const int64_t B = static_cast<int64_t>(ids.size());
  const int64_t H = cfg_.hidden_size, d = cfg_.head_dim, N = cfg_.num_hidden_layers;
  const float eps = static_cast<float>(cfg_.rms_norm_eps);
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  AERIE_CHECK(B > 0, who << ": empty batch");
  AERIE_CHECK(caches.empty() || static_cast<int64_t>(caches.size()) == B,
              who << ": " << caches.size() << " caches for " << B << " sequences");
  for (int a : aux_layers) AERIE_CHECK(a >= 0 && a <= N, who << ": aux layer " << a << " outside [0, " << N << "]");

  // Rows of sequence b: start[b] .. start[b+1]-1, at positions p0[b] ..
  std::vector<int64_t> start(B + 1, 0), p0(B, 0);
  std::vector<KVCache*> cache(B, nullptr);
  std::set<const KVCache*> seen;
  bool all_at_zero = true;  // every sequence starts at position 0 (its keys are its new rows only)
  int64_t longest = 0;
  for (int64_t b = 0; b < B; ++b) {
    const int64_t n_b = static_cast<int64_t>(ids[b].size());
    AERIE_CHECK(n_b > 0, who << ": sequence " << b << " has no ids");
    start[b + 1] = start[b] + n_b;
    longest = std::max(longest, n_b);
    KVCache* c = caches.empty() ? nullptr : caches[b];
    cache[b] = c;
    if (!c) continue;
    AERIE_CHECK(seen.insert(c).second, who << ": sequence " << b << "'s KV cache is also another sequence's");
    AERIE_CHECK(static_cast<int64_t>(c->k.size()) == N && c->k[0].dim(1) == m.nkv && c->k[0].dim(2) == d &&
                    c->k[0].dtype() == m.dtype && c->k[0].device() == m.device,
                who << ": KV cache of sequence " << b << " was made for another model, tp size, device or dtype");
    p0[b] = c->length();
    AERIE_CHECK(p0[b] + n_b <= c->capacity(), who << ": KV cache of sequence " << b << " holds " << c->capacity()
                                                  << " positions, " << p0[b] << " used, " << n_b << " more asked");
    if (p0[b] > 0) all_at_zero = false;
  }
  const int64_t n = start[B];

  const Device dev = m.device;
  const DType ct = m.dtype;  // compute dtype: GEMM inputs, KV cache, captured outputs
  auto on_device = [dev](Tensor t) { return dev == Device::CPU ? t : t.to_device(dev); };
  std::vector<int32_t> all_ids, pos;
  all_ids.reserve(n);
  pos.reserve(n);
  for (int64_t b = 0; b < B; ++b) {
    all_ids.insert(all_ids.end(), ids[b].begin(), ids[b].end());
    for (int64_t i = 0; i < start[b + 1] - start[b]; ++i) pos.push_back(static_cast<int32_t>(p0[b] + i));
  }
  Tensor ids_t = on_device(Tensor::from_vector(all_ids, {n}));
  Tensor positions = on_device(Tensor::from_vector(pos, {n}));
  Tensor ones;  // [n, 1] of 1 in the compute dtype, for the bias GEMMs (models with biases only)
  if (cfg_.qkv_bias || cfg_.o_bias || cfg_.mlp_bias) {
    Tensor ones_f = Tensor::from_vector(std::vector<float>(static_cast<size_t>(n), 1.0f), {n, 1});
    ones = on_device(ct == DType::F32 ? ones_f : ones_f.to(ct));
  }
  // Packed prefill: every sequence at position 0 and more than one of them -> one varlen attention
  // call per layer over the batch's own rows (a sliding layer too when no sequence exceeds its window).
  Tensor cu_seqlens;
  if (all_at_zero && B > 1) {
    std::vector<int32_t> cu(start.begin(), start.end());
    cu_seqlens = on_device(Tensor::from_vector(cu, {B + 1}));
  }

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
      copy_columns(rc, 0, out.aux_hidden, static_cast<int64_t>(j) * H, H);
    }
  };

  // Per-forward buffers, reused by every layer (shapes in the comments).
  Tensor r = Tensor::empty({n, H}, DType::F32, dev);                // r^l, the residual stream
  Tensor h = Tensor::empty({n, H}, ct, dev);                        // the RMSNorm output feeding a GEMM
  Tensor qkv = Tensor::empty({n, (m.nh + 2 * m.nkv) * d}, ct, dev);  // packed q/k/v GEMM output
  Tensor q = Tensor::empty({n, m.nh, d}, ct, dev);
  Tensor k_rows = Tensor::empty({n, m.nkv, d}, ct, dev), v_rows = Tensor::empty({n, m.nkv, d}, ct, dev);
  Tensor attn = Tensor::empty({n, m.nh, d}, ct, dev);
  Tensor o = Tensor::empty({n, H}, DType::F32, dev);     // o_proj / down_proj output (partial sum over tp)
  Tensor gu = Tensor::empty({n, 2 * m.inter}, ct, dev);  // packed gate/up GEMM output
  Tensor act = Tensor::empty({n, m.inter}, ct, dev);     // silu(g) * u
  // One sequence with a cache: q/k/v_rope writes k and v straight into the cache's slots.
  const bool direct_cache = B == 1 && cache[0] != nullptr;

  auto gemm = [&](const Tensor& x, const Tensor& W, Tensor& y) {
    prof.time(OpKind::Gemm, dev, [&] { matmul(x, W, y, false, true); });
  };
  auto bias = [&](Tensor& y, const Tensor& b) {
    if (b.defined()) prof.time(OpKind::Other, dev, [&] { add_bias(y, b, ones); });
  };
  auto reduce = [&](Tensor& y) {
    if (m.tp->size() > 1) prof.time(OpKind::AllReduce, dev, [&] { m.tp->all_reduce_sum(y); });
  };

  prof.time(OpKind::Other, dev, [&] { embedding_forward(ids_t, m.w.embed_tokens, r); });
  prof.time(OpKind::Norm, dev, [&] {
    rmsnorm_forward(r, N > 0 ? m.w.layers[0].input_layernorm : m.w.norm, eps, h, nullptr);
  });
  for (int64_t l = 0; l < N; ++l) {
    prof.time(OpKind::Other, dev, [&] { capture(l, r); });
    const LlamaLayerWeights& L = m.w.layers[l];
    gemm(h, L.qkv_proj, qkv);
    bias(qkv, L.qkv_bias);
    Tensor k = k_rows, v = v_rows;
    if (direct_cache) {
      k = cache[0]->k[l].slice(p0[0], p0[0] + n);
      v = cache[0]->v[l].slice(p0[0], p0[0] + n);
    }
    prof.time(OpKind::Rope, dev, [&] {
      qkv_rope_forward(qkv, positions, m.inv_freq, cfg_.qk_norm ? L.q_norm : Tensor(),
                       cfg_.qk_norm ? L.k_norm : Tensor(), eps, q, k, v);
    });
    const int64_t window = cfg_.sliding_layers[l] ? cfg_.sliding_window : 0;
    if (!direct_cache) {
      prof.time(OpKind::Other, dev, [&] {
        for (int64_t b = 0; b < B; ++b) {
          if (!cache[b]) continue;
          const int64_t s = start[b], e = start[b + 1];
          cache[b]->k[l].slice(p0[b], p0[b] + e - s).copy_from(k.slice(s, e));
          cache[b]->v[l].slice(p0[b], p0[b] + e - s).copy_from(v.slice(s, e));
        }
      });
    }
    prof.time(OpKind::Attention, dev, [&] {
      if (cu_seqlens.defined() && (window <= 0 || longest <= window)) {
        attention_forward_varlen(q, k, v, cu_seqlens, scale, attn, nullptr);
        return;
      }
      for (int64_t b = 0; b < B; ++b) {
        const int64_t s = start[b], e = start[b + 1];
        Tensor k_all = k.slice(s, e), v_all = v.slice(s, e), out_b = attn.slice(s, e);
        if (cache[b]) {
          k_all = cache[b]->k[l].slice(0, p0[b] + e - s);
          v_all = cache[b]->v[l].slice(0, p0[b] + e - s);
        }
        attend(q.slice(s, e), k_all, v_all, p0[b], window, scale, out_b);
      }
    });
    gemm(attn.reshape({n, m.nh * d}), L.o_proj, o);  // [n, H], partial sum over tp ranks
    reduce(o);
    bias(o, L.o_bias);  // once, after the reduction
    prof.time(OpKind::Norm, dev, [&] { add_rmsnorm_forward(r, o, L.post_attention_layernorm, eps, h); });

    gemm(h, L.gate_up_proj, gu);  // [n, 2 I/tp]
    bias(gu, L.gate_up_bias);
    prof.time(OpKind::Activation, dev, [&] { swiglu_packed_forward(gu, act); });
    gemm(act, L.down_proj, o);  // [n, H], partial sum over tp ranks
    reduce(o);
    bias(o, L.down_bias);
    // r^{l+1} = r + o, and h = the next layer's input_layernorm of it (after the last layer: final_norm).
    const Tensor& next_norm = l + 1 < N ? m.w.layers[l + 1].input_layernorm : m.w.norm;
    prof.time(OpKind::Norm, dev, [&] { add_rmsnorm_forward(r, o, next_norm, eps, h); });
  }
  prof.time(OpKind::Other, dev, [&] { capture(N, r); });
  out.final_hidden = h;  // z = final_norm(r^N)
  if (logits == Logits::All) {
    out.logits = Tensor::empty({n, m.w.lm_head.dim(0)}, DType::F32, dev);
    gemm(out.final_hidden, m.w.lm_head, out.logits);
  } else if (logits == Logits::Last) {
    // The last row of each sequence gathered first ([B, H]), then one lm_head GEMM.
    std::vector<int32_t> last(B);
    for (int64_t b = 0; b < B; ++b) last[b] = static_cast<int32_t>(start[b + 1] - 1);
    Tensor z_last = Tensor::empty({B, H}, ct, dev);
    prof.time(OpKind::Other, dev, [&] {
      embedding_forward(on_device(Tensor::from_vector(last, {B})), out.final_hidden, z_last);
    });
    out.logits = Tensor::empty({B, m.w.lm_head.dim(0)}, DType::F32, dev);
    gemm(z_last, m.w.lm_head, out.logits);
  }
  prof.count_forward(n);
  for (int64_t b = 0; b < B; ++b)
    if (cache[b]) cache[b]->length_ = p0[b] + start[b + 1] - start[b];
  return out;
}

}  // namespace aerie
