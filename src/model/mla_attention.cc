// Multi-head latent attention (model/blocks.h MlaSpec; transformers' DeepseekV3Attention.forward,
// deepseek-v3.md section 2): prefill in the expanded form (keys and values from kv_b, flash attention
// with a value head (v) narrower than the query/key head (dk)), decoding (a sequence with a cache and at most
// kMlaAbsorbedMaxRows new rows: eval's and generate's steps) in the absorbed form against the latent
// cache (absorbed() below; two or more one-row sequences of a step together with AERIE_BATCHED_DECODE=1:
// absorbed_batch()). Buffers per forward (this rank's nh heads,
// dk = nope + rope, L = the keys a sequence attends):
//   qa, qan [n, q_lora]   q [n, nh, dk]   ckv [n, kv_lora + rope]   latent [n | L, kv_lora + rope]
//   kv [L, nh, nope + v]   K [L, nh, dk], V [L, nh, v]
//   o_in [n, nh v] (the attention's output [n, nh, v] written in place)
#include <algorithm>
#include <cmath>
#include <vector>

#include "core/error.h"
#include "kernels/attention.h"
#include "kernels/gemm.h"
#include "kernels/mla.h"
#include "kernels/norm.h"
#include "kernels/rope.h"
#include "kernels/tensor_ops.h"
#include "model/blocks.h"

namespace aerie {

namespace {

class MlaAttention final : public AttentionBlock {
 public:
  MlaAttention(WeightSource& src, const MlaSpec& s, const std::string& p) : s_(s) {
    const int tp = src.tp_size();
    AERIE_CHECK(s.heads % tp == 0, "tp " << tp << " does not divide num_attention_heads " << s.heads);
    nh_ = s.heads / tp;
    dk_ = s.qk_nope + s.qk_rope;
    AERIE_CHECK(s.v_head >= 1 && s.v_head <= dk_, "MLA: v_head_dim " << s.v_head << " must lie in [1, qk_nope_head_dim + "
                                                                       "qk_rope_head_dim = " << dk_ << "]");
    const int64_t H = s.hidden, lat = s.kv_lora_rank + s.qk_rope;
    if (s.q_lora_rank > 0) {
      q_a_ = src.load_linear(p + "q_a_proj", {s.q_lora_rank, H}, TpSplit::None);
      q_norm_ = src.load(p + "q_a_layernorm.weight", {s.q_lora_rank}, TpSplit::None, ParamRole::Norm);
      q_b_ = src.load_linear(p + "q_b_proj", {s.heads * dk_, s.q_lora_rank}, TpSplit::Rows);
    } else {
      q_b_ = src.load_linear(p + "q_proj", {s.heads * dk_, H}, TpSplit::Rows);
    }
    kv_a_ = src.load_linear(p + "kv_a_proj_with_mqa", {lat, H}, TpSplit::None);
    kv_norm_ = src.load(p + "kv_a_layernorm.weight", {s.kv_lora_rank}, TpSplit::None, ParamRole::Norm);
    kv_b_ = src.load_linear(p + "kv_b_proj", {s.heads * (s.qk_nope + s.v_head), s.kv_lora_rank}, TpSplit::Rows);
    o_ = src.load_linear(p + "o_proj", {H, s.heads * s.v_head}, TpSplit::Cols);
  }

  Shape cache_k_row() const override { return {s_.kv_lora_rank + s_.qk_rope}; }
  Shape cache_v_row() const override { return {}; }

  void forward(ForwardContext& ctx, int64_t layer, const Tensor& h, Tensor& out) override {
    const ForwardBatch& b = ctx.batch;
    AERIE_CHECK(b.tree_parent.empty(), "tree verification (TargetModel::forward_tree) is not implemented for MLA "
                                       "attention yet: use chains (--tree-topk 1) with DeepSeek-V3 / Kimi targets");
    const int64_t n = b.n, nope = s_.qk_nope, rope = s_.qk_rope, lora = s_.kv_lora_rank, lat = lora + rope;
    const DType ct = ctx.dtype;
    // Queries: [n, nh, dk], q_pe rotated in place.
    Tensor q = ctx.buffer("mla.q", {n, nh_, dk_}, ct);
    Tensor q2 = q.reshape({n, nh_ * dk_});
    if (q_a_.defined()) {
      Tensor qa = ctx.buffer("mla.qa", {n, s_.q_lora_rank}, ct), qan = ctx.buffer("mla.qan", {n, s_.q_lora_rank}, ct);
      q_a_.matmul(ctx, h, qa);
      ctx.prof.time(OpKind::Norm, ctx.device, [&] { rmsnorm_forward(qa, q_norm_, s_.eps, qan, nullptr); });
      q_b_.matmul(ctx, qan, q2);
    } else {
      q_b_.matmul(ctx, h, q2);
    }
    Tensor qpe = ctx.buffer("mla.q_pe", {n, nh_, rope}, ct);
    ctx.prof.time(OpKind::Rope, ctx.device, [&] {
      Tensor rows = q.reshape({n * nh_, dk_}), pe = qpe.reshape({n * nh_, rope});
      copy_columns(rows, nope, pe, 0, rope);
      rope_apply_interleaved(qpe, b.positions, s_.inv_freq, s_.rope_scale);
      copy_columns(pe, 0, rows, nope, rope);
    });
    // This batch's latents [kv_norm(c_kv) | roped k_pe].
    Tensor ckv = ctx.buffer("mla.ckv", {n, lat}, ct), latent = ctx.buffer("mla.latent", {n, lat}, ct);
    kv_a_.matmul(ctx, h, ckv);
    Tensor c = ctx.buffer("mla.c", {n, lora}, ct), cn = ctx.buffer("mla.cn", {n, lora}, ct);
    Tensor kpe = ctx.buffer("mla.k_pe", {n, 1, rope}, ct);
    ctx.prof.time(OpKind::Norm, ctx.device, [&] {
      copy_columns(ckv, 0, c, 0, lora);
      rmsnorm_forward(c, kv_norm_, s_.eps, cn, nullptr);
      copy_columns(cn, 0, latent, 0, lora);
    });
    ctx.prof.time(OpKind::Rope, ctx.device, [&] {
      Tensor pe = kpe.reshape({n, rope});
      copy_columns(ckv, lora, pe, 0, rope);
      rope_apply_interleaved(kpe, b.positions, s_.inv_freq, s_.rope_scale);
      copy_columns(pe, 0, latent, lora, rope);
    });
    // Sequences with a cache and one new row (generate's decoding steps, two or more of them): one cache
    // append and one absorbed attention for all of them (absorbed_batch), not ~7 launches each
    // (batched_decoding: CUDA's default, tested in F32 and bf16 and 2.2-2.7x faster for Kimi-K2.5's generate
    // (docs/performance.md); opt-in on the CPU, AERIE_BATCHED_DECODE=1; latents up to 576 wide).
    const DecodeRows dr = decode_rows(b, lat <= 576 && batched_decoding(ctx.device, false, true));
    std::vector<Tensor*> dcache;
    for (int64_t i : dr.seq) dcache.push_back(&b.cache[i]->k[layer]);
    if (!dr.empty())
      ctx.prof.time(OpKind::Other, ctx.device, [&] { scatter_rows(latent, dr.rows, dcache, dr.positions); });
    for (int64_t i = 0; i < b.B; ++i) {
      if (!b.cache[i] || dr.taken[i]) continue;
      const int64_t s = b.start[i], e = b.start[i + 1];
      ctx.prof.time(OpKind::Other, ctx.device,
                    [&] { b.cache[i]->k[layer].slice(b.p0[i], b.p0[i] + e - s).copy_from(latent.slice(s, e)); });
    }
    Tensor o_in = ctx.buffer("mla.o_in", {n, nh_ * s_.v_head}, ct);
    Tensor attn = o_in.reshape({n, nh_, s_.v_head});  // the attention writes o_in's rows
    bool any_cache = false;
    for (const KVCache* c0 : b.cache) any_cache = any_cache || c0 != nullptr;
    if (!any_cache) {
      // Every sequence attends its own new rows: expand the batch's latents once.
      Tensor K, V;
      expand(ctx, latent, K, V);
      ctx.prof.time(OpKind::Attention, ctx.device, [&] {
        if (b.cu_seqlens.defined()) {
          attention_forward_varlen(q, K, V, b.cu_seqlens, s_.softmax_scale, attn, nullptr);
          return;
        }
        for (int64_t i = 0; i < b.B; ++i) {
          const int64_t s = b.start[i], e = b.start[i + 1];
          Tensor out_b = attn.slice(s, e);
          attention_forward(q.slice(s, e), K.slice(s, e), V.slice(s, e), 0, s_.softmax_scale, out_b, nullptr);
        }
      });
    }
    Tensor kv_b_w;  // kv_b's [nh (nope + v), lora] in the compute dtype, for the absorbed form
    if (!dr.empty()) {
      kv_b_w = kv_b_weight(ctx);
      absorbed_batch(ctx, q, dr.rows, dcache, dr.lengths, kv_b_w, o_in);
    }
    for (int64_t i = 0; i < b.B && any_cache; ++i) {
      if (dr.taken[i]) continue;
      const int64_t s = b.start[i], e = b.start[i + 1];
      if (b.cache[i] && e - s <= kMlaAbsorbedMaxRows) {
        // Decoding: the absorbed form against the latent cache, straight into o_in's rows.
        if (!kv_b_w.defined()) kv_b_w = kv_b_weight(ctx);
        absorbed(ctx, q, s, e, b.cache[i]->k[layer].slice(0, b.p0[i] + e - s), b.p0[i], kv_b_w, o_in);
        continue;
      }
      const Tensor lat_all = b.cache[i] ? b.cache[i]->k[layer].slice(0, b.p0[i] + e - s) : latent.slice(s, e);
      Tensor K, V, out_b = attn.slice(s, e);
      expand(ctx, lat_all, K, V);
      ctx.prof.time(OpKind::Attention, ctx.device, [&] {
        attention_forward(q.slice(s, e), K, V, b.p0[i], s_.softmax_scale, out_b, nullptr);
      });
    }
    o_.matmul(ctx, o_in, out);  // [n, H], partial sum over tp ranks
    ctx.all_reduce(out);
  }

 private:
  /// kv_b's weight [nh (nope + v), kv_lora] in the compute dtype: the dense weight itself, or a
  /// quantized one dequantized into the forward's scratch.
  Tensor kv_b_weight(ForwardContext& ctx) {
    if (kv_b_.format == WeightFormat::Dense) return kv_b_.weight;
    Tensor w = ctx.scratch("mla.kv_b", kv_b_.out * kv_b_.in, ctx.dtype).reshape({kv_b_.out, kv_b_.in});
    ctx.prof.time(OpKind::Other, ctx.device, [&] { kv_b_.dequantize(w); });
    return w;
  }

  /// The absorbed form (DeepSeek-V2 section 2.1.2) of rows [s, e) of one sequence against its latent
  /// cache lat [L, lora + rope] (L = p0 + e - s, this batch's rows included), into o_in's rows [s, e):
  ///   q_lat [m, nh, lora + rope] = [q_nope_h W_UK_h | q_pe_h]   (W_UK_h = kv_b rows h (nope + v) + [0, nope))
  ///   scores [m nh, L] F32 = q_lat lat^T; p = causal softmax(softmax_scale scores)  (MQA: one latent "head")
  ///   o [m nh, lora + rope] = p lat                              (its first lora columns are the value)
  ///   o_in[:, h] [m, v] = o_h[:, :lora] W_UV_h^T                 (W_UV_h = kv_b rows h (nope + v) + nope + [0, v))
  /// The same attention as the expanded form (q_nope . k_nope = q_nope . W_UK c), with no per-step
  /// expansion of the cache: O(L (lora + rope)) per query and head instead of kv_b over all L keys.
  void absorbed(ForwardContext& ctx, const Tensor& q, int64_t s, int64_t e, const Tensor& lat, int64_t p0,
                const Tensor& w, Tensor& o_in) {
    const int64_t m = e - s, L = lat.dim(0), nope = s_.qk_nope, rope = s_.qk_rope, lora = s_.kv_lora_rank;
    const int64_t vd = s_.v_head, la = lora + rope, hs = (nope + vd) * lora;  // hs: kv_b's rows of one head
    const DType ct = ctx.dtype;
    Tensor ql = ctx.buffer("mla.q_lat", {m, nh_, la}, ct);
    ctx.prof.time(OpKind::Gemm, ctx.device, [&] {
      matmul_strided_batched({&q, s * nh_ * dk_, nh_ * dk_, dk_}, {&w, 0, lora, hs}, {&ql, 0, nh_ * la, la}, m, lora,
                             nope, nh_, false);
    });
    ctx.prof.time(OpKind::Other, ctx.device, [&] {
      Tensor rows = ql.reshape({m * nh_, la});
      copy_columns(q.slice(s, e).reshape({m * nh_, dk_}), nope, rows, lora, rope);
    });
    Tensor scores = ctx.buffer("mla.scores", {m * nh_, L}, DType::F32), p = ctx.buffer("mla.p", {m * nh_, L}, ct);
    Tensor o = ctx.buffer("mla.o_lat", {m * nh_, la}, ct);
    ctx.prof.time(OpKind::Attention, ctx.device, [&] {
      matmul(ql.reshape({m * nh_, la}), lat, scores, false, true);
      causal_softmax_rows(scores, s_.softmax_scale, nh_, p0, p);
      matmul(p, lat, o, false, false);
    });
    ctx.prof.time(OpKind::Gemm, ctx.device, [&] {
      matmul_strided_batched({&o, 0, nh_ * la, la}, {&w, nope * lora, lora, hs}, {&o_in, s * nh_ * vd, nh_ * vd, vd},
                             m, vd, lora, nh_, true);
    });
  }

  /// absorbed() for many sequences of one new row each (rows[i] of q, latent caches caches[i] [>= len, lora +
  /// rope] holding lengths[i] positions, this row's included), gathered into m = rows.size() rows: q_lat
  /// and the value projection as one strided-batched GEMM each over the m rows, the attention as one
  /// attention_decode_batch (the latent as keys [L, 1, lora + rope] and, its first lora columns, values; p
  /// stays fp32 where absorbed() rounds it to the compute dtype), the results scattered to o_in's rows[i].
  void absorbed_batch(ForwardContext& ctx, const Tensor& q, const std::vector<int64_t>& rows,
                      const std::vector<Tensor*>& caches, const std::vector<int64_t>& lengths, const Tensor& w,
                      Tensor& o_in) {
    const int64_t m = static_cast<int64_t>(rows.size()), nope = s_.qk_nope, rope = s_.qk_rope;
    const int64_t lora = s_.kv_lora_rank, vd = s_.v_head, la = lora + rope, hs = (nope + vd) * lora;
    const DType ct = ctx.dtype;
    std::vector<int64_t> own(static_cast<size_t>(m));  // row i of the gathered tensors
    for (int64_t i = 0; i < m; ++i) own[static_cast<size_t>(i)] = i;
    Tensor qg = ctx.buffer("mla.q_batch", {m, nh_, dk_}, ct);
    ctx.prof.time(OpKind::Other, ctx.device, [&] {
      scatter_rows(q, rows, std::vector<Tensor*>(static_cast<size_t>(m), &qg), own);
    });
    Tensor ql = ctx.buffer("mla.q_lat_batch", {m, nh_, la}, ct);
    ctx.prof.time(OpKind::Gemm, ctx.device, [&] {
      matmul_strided_batched({&qg, 0, nh_ * dk_, dk_}, {&w, 0, lora, hs}, {&ql, 0, nh_ * la, la}, m, lora, nope, nh_,
                             false);
    });
    ctx.prof.time(OpKind::Other, ctx.device, [&] {
      Tensor r = ql.reshape({m * nh_, la});
      copy_columns(qg.reshape({m * nh_, dk_}), nope, r, lora, rope);
    });
    Tensor o = ctx.buffer("mla.o_lat_batch", {m, nh_, lora}, ct);
    std::vector<Tensor> lat;
    lat.reserve(caches.size());
    for (Tensor* c : caches) lat.push_back(c->reshape({c->dim(0), 1, la}));
    std::vector<const Tensor*> kv;
    for (const Tensor& t : lat) kv.push_back(&t);
    ctx.prof.time(OpKind::Attention, ctx.device,
                  [&] { attention_decode_batch(ql, own, kv, kv, lengths, s_.softmax_scale, o); });
    Tensor og = ctx.buffer("mla.o_in_batch", {m, nh_ * vd}, ct);
    ctx.prof.time(OpKind::Gemm, ctx.device, [&] {
      matmul_strided_batched({&o, 0, nh_ * lora, lora}, {&w, nope * lora, lora, hs}, {&og, 0, nh_ * vd, vd}, m, vd,
                             lora, nh_, true);
    });
    ctx.prof.time(OpKind::Other, ctx.device, [&] {
      std::vector<Tensor*> dst(static_cast<size_t>(m), &o_in);
      scatter_rows(og, own, dst, rows);
    });
  }

  /// Keys and values of latents [L, kv_lora + rope]: kv = kv_b(c) [L, nh, nope + v];
  /// K [L, nh, dk] = [k_nope | k_pe], V [L, nh, dk] = [v | 0].
  void expand(ForwardContext& ctx, const Tensor& lat, Tensor& K, Tensor& V) {
    const int64_t L = lat.dim(0), nope = s_.qk_nope, lora = s_.kv_lora_rank, vd = s_.v_head;
    const DType ct = ctx.dtype;
    Tensor c = Tensor::empty({L, lora}, ct, ctx.device), kv = Tensor::empty({L, nh_ * (nope + vd)}, ct, ctx.device);
    K = Tensor::empty({L, nh_, dk_}, ct, ctx.device);
    V = Tensor::empty({L, nh_, s_.v_head}, ct, ctx.device);
    ctx.prof.time(OpKind::Other, ctx.device, [&] { copy_columns(lat, 0, c, 0, lora); });
    kv_b_.matmul(ctx, c, kv);
    ctx.prof.time(OpKind::Other, ctx.device, [&] { mla_expand_kv(kv, lat, nope, vd, lora, K, V); });
  }

  MlaSpec s_;
  int64_t nh_ = 0, dk_ = 0;         // this rank's heads; query/key head dim nope + rope
  Linear q_a_, q_b_, kv_a_, kv_b_, o_;  // q_b_ is q_proj without q_lora
  Tensor q_norm_, kv_norm_;         // [q_lora], [kv_lora] F32
};

}  // namespace

std::unique_ptr<AttentionBlock> make_mla_attention(WeightSource& src, const MlaSpec& spec, const std::string& prefix) {
  WeightSource::Scope scope(src, WeightCategory::Attention);
  return std::make_unique<MlaAttention>(src, spec, prefix);
}

}  // namespace aerie
