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
// Precision (LlamaModelOptions): in the BF16 mode r stays F32, h, q, k, v, the attention output, g and u
// are bf16 (GEMM inputs), and o_proj / down_proj write F32 into the residual add; every op accumulates
// in fp32. The F32 mode computes everything in fp32.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <set>

#include "core/device.h"
#include "core/error.h"
#include "kernels/activation.h"
#include "kernels/attention.h"
#include "kernels/convert.h"
#include "kernels/embedding.h"
#include "kernels/gemm.h"
#include "kernels/norm.h"
#include "kernels/optim.h"
#include "kernels/rope.h"
#include "kernels/tensor_ops.h"
#include "model/llama.h"
#include "model/llama_impl.h"

namespace aerie {

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
  rmsnorm_forward(x, w, eps, y, nullptr);
  return y;
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
  const Impl& m = *impl_;
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
  Tensor ones_f = Tensor::from_vector(std::vector<float>(static_cast<size_t>(n), 1.0f), {n, 1});
  Tensor ones = on_device(ct == DType::F32 ? ones_f : ones_f.to(ct));
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
    const int64_t window = cfg_.sliding_layers[l] ? cfg_.sliding_window : 0;
    for (int64_t b = 0; b < B; ++b) {
      if (!cache[b]) continue;
      const int64_t s = start[b], e = start[b + 1];
      cache[b]->k[l].slice(p0[b], p0[b] + e - s).copy_from(k.slice(s, e));
      cache[b]->v[l].slice(p0[b], p0[b] + e - s).copy_from(v.slice(s, e));
    }
    if (cu_seqlens.defined() && (window <= 0 || longest <= window)) {
      attention_forward_varlen(q, k, v, cu_seqlens, scale, attn, nullptr);
    } else {
      for (int64_t b = 0; b < B; ++b) {
        const int64_t s = start[b], e = start[b + 1];
        Tensor k_all = k.slice(s, e), v_all = v.slice(s, e), o = attn.slice(s, e);
        if (cache[b]) {
          k_all = cache[b]->k[l].slice(0, p0[b] + e - s);
          v_all = cache[b]->v[l].slice(0, p0[b] + e - s);
        }
        attend(q.slice(s, e), k_all, v_all, p0[b], window, scale, o);
      }
    }
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
  if (logits == Logits::All) {
    out.logits = linear(out.final_hidden, m.w.lm_head, Tensor(), ones, DType::F32);
  } else if (logits == Logits::Last) {
    // The last row of each sequence gathered first ([B, H]), then one lm_head GEMM.
    std::vector<int32_t> last(B);
    for (int64_t b = 0; b < B; ++b) last[b] = static_cast<int32_t>(start[b + 1] - 1);
    Tensor z_last = Tensor::empty({B, H}, ct, dev);
    embedding_forward(on_device(Tensor::from_vector(last, {B})), out.final_hidden, z_last);
    out.logits = linear(z_last, m.w.lm_head, Tensor(), ones.slice(0, B), DType::F32);
  }
  for (int64_t b = 0; b < B; ++b)
    if (cache[b]) cache[b]->length_ = p0[b] + start[b + 1] - start[b];
  return out;
}

}  // namespace aerie
