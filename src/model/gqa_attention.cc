// Grouped-query attention, the attention block of the Llama family (transformers'
// modeling_{llama,mistral,qwen2,qwen3}.py *Attention), tensor parallel by heads:
//   q, k, v = h Wq^T + bq, h Wk^T + bk, h Wv^T + bv   (this rank's heads, one packed GEMM)
//   q, k = q_norm(q), k_norm(k) per head over head_dim (Qwen3 only)
//   q, k = RoPE(q, k) at positions p0_b .. p0_b+n_b-1 of each sequence (p0_b = its cache length)
//   out = all_reduce_sum(attention(q, [cache k; k], [cache v; v]) Wo^T) + bo  (Wo: this rank's columns;
//         each sequence attends its own keys only; a sliding-window layer's query at p attends keys
//         (p - W, p] only)
// qkv_rope_forward does the split, q/k norm and RoPE in one kernel and, for a single cached sequence,
// writes k and v into the cache's slots directly.
// A step of two or more cached sequences with one new row each (generate's decoding) appends their keys with
// one scatter_rows and attends with one attention_decode_batch (model/blocks.h batched_decoding: on by
// default; AERIE_BATCHED_DECODE=0 turns it off); the other sequences go one by one.
#include <algorithm>
#include <cmath>
#include <vector>

#include "core/error.h"
#include "kernels/attention.h"
#include "kernels/embedding.h"
#include "kernels/fused.h"
#include "kernels/tensor_ops.h"
#include "model/blocks.h"

namespace aerie {

namespace {

/// Tree attention (TargetModel::forward_tree): q [n, nh, d], row i at position p0 + depth[i], over the
/// cached prefix k_all / v_all [0, p0) and the tree rows p0 + j, j an ancestor of i or i itself
/// (rows breadth-first, so each depth is a contiguous range of rows: ForwardBatch::tree_groups). The
/// prefix part is one attention_forward (every row sees all p0 keys), then each depth's rows merge their
/// depth + 1 path keys with the TTT kernels' log-sum-exp merge: the same sums as a causal attention over
/// each root-to-row path, in another order. The path keys of every depth are gathered in one gather of
/// K and one of V from the slots the forward built once (ForwardBatch::tree_path_slots), into workspace
/// buffers: no host round trip and no allocation per layer.
void tree_attend(ForwardContext& ctx, const Tensor& q, const Tensor& k_all, const Tensor& v_all, int64_t p0,
                 float scale, Tensor& out) {
  const ForwardBatch& b = ctx.batch;
  const int64_t n = q.dim(0), nh = q.dim(1), nkv = k_all.dim(1), d = k_all.dim(2), dv = v_all.dim(2);
  const int64_t slots = b.tree_path_slots.numel();
  Tensor lse = ctx.buffer("gqa.tree_lse", {n, nh}, DType::F32);
  attention_forward(q, k_all.slice(0, p0), v_all.slice(0, p0), p0, scale, out, &lse);
  const Tensor k2 = k_all.reshape({k_all.dim(0), nkv * d}), v2 = v_all.reshape({v_all.dim(0), nkv * dv});
  Tensor pk_all = ctx.buffer("gqa.tree_path_k", {slots, nkv * d}, k_all.dtype());
  Tensor pv_all = ctx.buffer("gqa.tree_path_v", {slots, nkv * dv}, v_all.dtype());
  embedding_forward_in_range(b.tree_path_slots, k2, pk_all, p0 + n);  // every slot is below p0 + n
  embedding_forward_in_range(b.tree_path_slots, v2, pv_all, p0 + n);
  std::vector<Tensor> dk, dvv;
  std::vector<const Tensor*> pk, pv;
  for (const ForwardBatch::TreeGroup& g : b.tree_groups) {
    const int64_t m = g.end - g.begin;
    dk.assign(g.depth + 1, Tensor());
    dvv.assign(g.depth + 1, Tensor());
    pk.clear();
    pv.clear();
    for (int32_t j = 0; j <= g.depth; ++j) {
      const int64_t r0 = g.offset + j * m;
      dk[j] = pk_all.slice(r0, r0 + m).reshape({m, nkv, d});
      dvv[j] = pv_all.slice(r0, r0 + m).reshape({m, nkv, dv});
      pk.push_back(&dk[j]);
      pv.push_back(&dvv[j]);
    }
    Tensor o = out.slice(g.begin, g.end), l = lse.slice(g.begin, g.end);
    attention_merge_diagonal_forward(q.slice(g.begin, g.end), pk, pv, scale, o, l);
  }
}

class GqaAttention final : public AttentionBlock {
 public:
  GqaAttention(WeightSource& src, const GqaSpec& s, const std::string& p) : spec_(s) {
    const int tp = src.tp_size();
    // Fewer kv heads than ranks (Qwen3-235B-A22B's 4 at tp 8): each kv head is replicated over tp / kv_heads
    // ranks, and rank r holds kv head r / (tp / kv_heads), the one its query heads read (vLLM's
    // QKVParallelLinear with num_kv_head_replicas).
    const bool replicated = s.kv_heads < tp && tp % s.kv_heads == 0;
    AERIE_CHECK(s.heads % tp == 0 && (replicated || s.kv_heads % tp == 0),
                "tp " << tp << " does not divide num_attention_heads " << s.heads << " / num_key_value_heads "
                      << s.kv_heads << " (nor is it a multiple of num_key_value_heads, whose heads would then be "
                                       "replicated): aerie's attention splits whole heads");
    nh_ = s.heads / tp;
    nkv_ = replicated ? 1 : s.kv_heads / tp;
    const int64_t H = s.hidden, d = s.head_dim;
    const std::vector<LinearTensor> q = {{p + "q_proj", {s.heads * d, H}}};
    const std::vector<LinearTensor> kv = {{p + "k_proj", {s.kv_heads * d, H}}, {p + "v_proj", {s.kv_heads * d, H}}};
    auto load_kv = [&](auto&& load) {  // k and v split by kv head, under the replication's split if any
      if (!replicated) return load();
      WeightSource::SplitAs as(src, src.tp_rank() / (tp / static_cast<int>(s.kv_heads)), static_cast<int>(s.kv_heads));
      return load();
    };
    if (!replicated) {
      std::vector<LinearTensor> qkv = q;
      qkv.insert(qkv.end(), kv.begin(), kv.end());
      qkv_ = src.load_linear(qkv, TpSplit::Rows);  // this rank's q, k, v rows, packed: one GEMM
    } else {
      qkv_ = stack_linear_rows(src.load_linear(q, TpSplit::Rows),
                               load_kv([&] { return src.load_linear(kv, TpSplit::Rows); }));
    }
    if (s.qkv_bias) {
      qkv_.bias = Tensor::empty({(nh_ + 2 * nkv_) * d}, src.dtype(), src.device());
      src.load_into(p + "q_proj.bias", {s.heads * d}, TpSplit::Rows, ParamRole::Bias, qkv_.bias.slice(0, nh_ * d));
      load_kv([&] {
        for (int i = 0; i < 2; ++i) {
          const int64_t b0 = (nh_ + i * nkv_) * d;
          src.load_into(kv[i].name + ".bias", {s.kv_heads * d}, TpSplit::Rows, ParamRole::Bias,
                        qkv_.bias.slice(b0, b0 + nkv_ * d));
        }
        return 0;
      });
    }
    o_ = src.load_linear(p + "o_proj", {H, s.heads * d}, TpSplit::Cols);
    if (s.o_bias) o_.bias = src.load(p + "o_proj.bias", {H}, TpSplit::None, ParamRole::Bias);
    if (s.qk_norm) {
      q_norm_ = src.load(p + "q_norm.weight", {d}, TpSplit::None, ParamRole::Norm);
      k_norm_ = src.load(p + "k_norm.weight", {d}, TpSplit::None, ParamRole::Norm);
    }
  }

  Shape cache_k_row() const override { return {nkv_, spec_.head_dim}; }
  Shape cache_v_row() const override { return {nkv_, spec_.head_dim}; }

  void forward(ForwardContext& ctx, int64_t layer, const Tensor& h, Tensor& out) override {
    const ForwardBatch& b = ctx.batch;
    const int64_t n = b.n, d = spec_.head_dim, l = layer;
    const DType ct = ctx.dtype;
    const float scale = 1.0f / std::sqrt(static_cast<float>(d));
    Tensor qkv = ctx.buffer("gqa.qkv", {n, (nh_ + 2 * nkv_) * d}, ct);  // packed q/k/v GEMM output
    Tensor q = ctx.buffer("gqa.q", {n, nh_, d}, ct);
    Tensor k = ctx.buffer("gqa.k", {n, nkv_, d}, ct), v = ctx.buffer("gqa.v", {n, nkv_, d}, ct);
    Tensor attn = ctx.buffer("gqa.attn", {n, nh_, d}, ct);
    qkv_.forward(ctx, h, qkv);
    KVCache* c0 = b.cache.empty() ? nullptr : b.cache[0];
    if (b.direct_cache) {
      k = c0->k[l].slice(b.p0[0], b.p0[0] + n);
      v = c0->v[l].slice(b.p0[0], b.p0[0] + n);
    }
    ctx.prof.time(OpKind::Rope, ctx.device, [&] {
      qkv_rope_forward(qkv, b.positions, spec_.inv_freq, q_norm_, k_norm_, spec_.eps, q, k, v);
    });
    // Sequences with a cache and one new row (a decoding step of generate's continuous batching): their
    // cache appends and their attention go in one call each for all of them, not one or two per sequence
    // (batched_decoding: on by default, the same arithmetic on the CPU; AERIE_BATCHED_DECODE=0 turns it off).
    const DecodeRows dr = decode_rows(b, batched_decoding(ctx.device, true, true));
    std::vector<Tensor*> dk, dv;
    std::vector<const Tensor*> ck, cv;
    for (int64_t i : dr.seq) {
      dk.push_back(&b.cache[i]->k[l]);
      dv.push_back(&b.cache[i]->v[l]);
      ck.push_back(dk.back());
      cv.push_back(dv.back());
    }
    if (!b.direct_cache) {
      ctx.prof.time(OpKind::Other, ctx.device, [&] {
        if (!dr.empty()) {
          scatter_rows(k, dr.rows, dk, dr.positions);
          scatter_rows(v, dr.rows, dv, dr.positions);
        }
        for (int64_t i = 0; i < b.B; ++i) {
          if (!b.cache[i] || dr.taken[i]) continue;
          const int64_t s = b.start[i], e = b.start[i + 1];
          b.cache[i]->k[l].slice(b.p0[i], b.p0[i] + e - s).copy_from(k.slice(s, e));
          b.cache[i]->v[l].slice(b.p0[i], b.p0[i] + e - s).copy_from(v.slice(s, e));
        }
      });
    }
    const int64_t window = spec_.window;
    ctx.prof.time(OpKind::Attention, ctx.device, [&] {
      if (!b.tree_parent.empty()) {
        // Every key of a row's path lies inside its window when its position is below the window.
        AERIE_CHECK(window <= 0 || b.p0[0] + b.tree_depth.back() < window,
                    "tree verification (TargetModel::forward_tree) past a sliding window of " << window
                                                                                              << " is not implemented");
        tree_attend(ctx, q, c0->k[l].slice(0, b.p0[0] + n), c0->v[l].slice(0, b.p0[0] + n), b.p0[0], scale, attn);
        return;
      }
      if (b.cu_seqlens.defined() && (window <= 0 || b.longest <= window)) {
        attention_forward_varlen(q, k, v, b.cu_seqlens, scale, attn, nullptr);
        return;
      }
      if (!dr.empty()) attention_decode_batch(q, dr.rows, ck, cv, dr.lengths, scale, attn, std::max<int64_t>(window, 0));
      for (int64_t i = 0; i < b.B; ++i) {
        if (dr.taken[i]) continue;
        const int64_t s = b.start[i], e = b.start[i + 1];
        Tensor k_all = k.slice(s, e), v_all = v.slice(s, e), out_b = attn.slice(s, e);
        if (b.cache[i]) {
          k_all = b.cache[i]->k[l].slice(0, b.p0[i] + e - s);
          v_all = b.cache[i]->v[l].slice(0, b.p0[i] + e - s);
        }
        // Rows at positions p0 .. attend keys p-W < j <= p under a window W (transformers'
        // sliding_window_overlay): attention_forward's window.
        attention_forward(q.slice(s, e), k_all, v_all, b.p0[i], scale, out_b, nullptr, std::max<int64_t>(window, 0));
      }
    });
    o_.matmul(ctx, attn.reshape({n, nh_ * d}), out);  // [n, H], partial sum over tp ranks
    ctx.all_reduce(out, o_.bias);  // the bias once, after the reduction
  }

 private:
  GqaSpec spec_;
  int64_t nh_ = 0, nkv_ = 0;  // this rank's heads and kv heads
  Linear qkv_, o_;            // qkv_: [(nh + 2 nkv) d, H] rows q, k, v; o_: [H, nh d]
  Tensor q_norm_, k_norm_;    // [d] F32 (Qwen3) or undefined
};

}  // namespace

std::unique_ptr<AttentionBlock> make_gqa_attention(WeightSource& src, const GqaSpec& spec, const std::string& prefix) {
  WeightSource::Scope scope(src, WeightCategory::Attention);
  return std::make_unique<GqaAttention>(src, spec, prefix);
}

}  // namespace aerie
