// The target's forward: the decoder-layer scaffold, written once for every architecture, over a batch
// of B sequences whose rows are concatenated (n = sum n_b rows; forward() is B = 1), tensor parallel
// over the ranks of a tp group, with the captures of eagle3.md section 1 and a KV cache.
//
// Per layer l (residual stream r = r^l, [n, H] F32, identical on every tp rank):
//   capture r^l if l is an aux layer
//   h = input_norm(r);  r += attn(h)   (the block's all-reduced update, model/blocks.h)
//   h = post_norm(r);   r += ffn(h)
// then z = norm(r^N), logits = z W_lm^T (all rows, or the last row of each sequence). Every residual
// add is fused with the RMSNorm that follows it (add_rmsnorm_forward: post_norm, the next layer's
// input_norm, after the last layer final_norm). The tensors built here (ids, positions, sequence
// boundaries) are moved to the weights' device.
// Precision (TargetModelOptions): in the BF16 mode r stays F32 and the blocks' GEMM inputs are bf16;
// the blocks write F32 into the residual add; every op accumulates in fp32. The F32 mode computes
// everything in fp32. Profiling: every op is timed by category when AERIE_PROFILE=1 (model/op_profile.h).
#include <algorithm>
#include <cstdlib>
#include <memory>
#include <set>

#include "core/error.h"
#include "kernels/convert.h"
#include "kernels/embedding.h"
#include "kernels/fused.h"
#include "kernels/norm.h"
#include "kernels/tensor_ops.h"
#include "model/blocks.h"
#include "model/target.h"
#include "model/target_impl.h"

namespace aerie {

namespace {

// A token tree's rows (one sequence after a cached prefix): checks the parents (row 0 the root, -1; every other
// row's parent before it; rows in breadth-first order) and sets batch.tree_parent and tree_depth.
void set_tree(ForwardBatch& batch, const std::vector<int32_t>& parent, const char* who) {
  const int64_t n = batch.n;
  AERIE_CHECK(batch.B == 1 && batch.cache[0] && batch.p0[0] >= 1,
              who << ": a token tree follows a cached prefix of at least one position");
  AERIE_CHECK(static_cast<int64_t>(parent.size()) == n, who << ": " << parent.size() << " parents for " << n << " tree rows");
  batch.tree_parent = parent;
  batch.tree_depth.assign(n, 0);
  for (int64_t i = 0; i < n; ++i) {
    const int32_t pa = batch.tree_parent[i];
    AERIE_CHECK(i == 0 ? pa == -1 : pa >= 0 && pa < i,
                who << ": row " << i << "'s parent " << pa << " (row 0 is the root, -1; others before themselves)");
    if (i > 0) batch.tree_depth[i] = batch.tree_depth[pa] + 1;
    AERIE_CHECK(i == 0 || batch.tree_depth[i] >= batch.tree_depth[i - 1],
                who << ": row " << i << " is shallower than row " << i - 1 << " (rows in breadth-first order)");
  }
}

// The tree's rows grouped by depth into batch.tree_groups, and the cache slots of each group's paths (for group g
// of m rows at depth d: slots[g.offset + j * m + i] is the slot of row i's ancestor at depth j, j = 0 .. d).
std::vector<int32_t> tree_groups(ForwardBatch& batch) {
  std::vector<int32_t> slots;
  for (int64_t s = 0; s < batch.n;) {
    ForwardBatch::TreeGroup g;
    g.begin = s;
    g.depth = batch.tree_depth[s];
    g.offset = static_cast<int64_t>(slots.size());
    while (s < batch.n && batch.tree_depth[s] == g.depth) ++s;
    g.end = s;
    const int64_t m = g.end - g.begin;
    slots.resize(slots.size() + m * (g.depth + 1));
    for (int64_t i = 0; i < m; ++i) {
      int32_t r = static_cast<int32_t>(g.begin + i);
      for (int32_t j = g.depth; j >= 0; --j) {
        slots[g.offset + j * m + i] = static_cast<int32_t>(batch.p0[0]) + r;
        r = batch.tree_parent[r];
      }
    }
    batch.tree_groups.push_back(g);
  }
  return slots;
}

}  // namespace

TargetOutput TargetModel::forward(const std::vector<int32_t>& ids, KVCache* cache,
                                  const std::vector<int>& aux_layers, bool want_logits) {
  return run({ids}, {cache}, aux_layers, want_logits ? Logits::All : Logits::None, "TargetModel::forward");
}

TargetOutput TargetModel::forward_tree(const std::vector<int32_t>& ids, const std::vector<int32_t>& parent,
                                       KVCache* cache, const std::vector<int>& aux_layers, bool want_logits) {
  return run({ids}, {cache}, aux_layers, want_logits ? Logits::All : Logits::None, "TargetModel::forward_tree",
             &parent);
}

TargetOutput TargetModel::forward_batch(const std::vector<std::vector<int32_t>>& ids,
                                        const std::vector<KVCache*>& caches, const std::vector<int>& aux_layers,
                                        Logits logits) {
  return run(ids, caches, aux_layers, logits, "TargetModel::forward_batch");
}

namespace {

// The batch of sequences ids[b0 .. b1) with their caches (caches empty: none) on `device`: row ranges, cache
// positions (each cache checked against the target's `layers` and compute `dtype`), positions, the
// packed-prefill boundaries, the token tree of `tree_parent`.
ForwardBatch make_batch(const std::vector<DecoderLayer>& layers, Device device, DType dtype,
                        const std::vector<std::vector<int32_t>>& ids, const std::vector<KVCache*>& caches, int64_t b0,
                        int64_t b1, const char* who, const std::vector<int32_t>* tree_parent) {
  const int64_t B = b1 - b0, N = static_cast<int64_t>(layers.size());
  ForwardBatch batch;
  batch.B = B;
  batch.start.assign(B + 1, 0);
  batch.p0.assign(B, 0);
  batch.cache.assign(B, nullptr);
  std::set<const KVCache*> seen;
  bool all_at_zero = true;  // every sequence starts at position 0 (its keys are its new rows only)
  for (int64_t b = 0; b < B; ++b) {
    const int64_t n_b = static_cast<int64_t>(ids[b0 + b].size());
    AERIE_CHECK(n_b > 0, who << ": sequence " << b0 + b << " has no ids");
    batch.start[b + 1] = batch.start[b] + n_b;
    batch.longest = std::max(batch.longest, n_b);
    KVCache* c = caches.empty() ? nullptr : caches[b0 + b];
    batch.cache[b] = c;
    if (!c) continue;
    AERIE_CHECK(seen.insert(c).second, who << ": sequence " << b0 + b << "'s KV cache is also another sequence's");
    bool fits = static_cast<int64_t>(c->k.size()) == N && static_cast<int64_t>(c->v.size()) == N;
    for (int64_t l = 0; fits && l < N; ++l) {
      auto row = [](const Tensor& t) { return t.defined() ? Shape(t.shape().begin() + 1, t.shape().end()) : Shape{}; };
      const Shape kr = row(c->k[l]), vr = row(c->v[l]);
      fits = kr == layers[l].attn->cache_k_row() && vr == layers[l].attn->cache_v_row() &&
             c->k[l].dtype() == dtype && c->k[l].device() == device;
    }
    AERIE_CHECK(fits, who << ": KV cache of sequence " << b0 + b << " was made for another model, tp size, device or dtype");
    batch.p0[b] = c->length();
    AERIE_CHECK(batch.p0[b] + n_b <= c->capacity(), who << ": KV cache of sequence " << b0 + b << " holds "
                                                        << c->capacity() << " positions, " << batch.p0[b]
                                                        << " used, " << n_b << " more asked");
    if (batch.p0[b] > 0) all_at_zero = false;
  }
  batch.n = batch.start[B];
  if (tree_parent) set_tree(batch, *tree_parent, who);
  auto on_device = [device](Tensor t) { return device == Device::CPU ? t : t.to_device(device); };
  std::vector<int32_t> pos;
  pos.reserve(batch.n);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < batch.start[b + 1] - batch.start[b]; ++i)
      pos.push_back(static_cast<int32_t>(batch.p0[b] + (batch.tree_depth.empty() ? i : batch.tree_depth[i])));
  batch.positions = on_device(Tensor::from_vector(pos, {batch.n}));
  if (!batch.tree_depth.empty()) {  // the ancestor slots of every depth's rows, uploaded once (tree_attend)
    const std::vector<int32_t> slots = tree_groups(batch);
    batch.tree_path_slots = on_device(Tensor::from_vector(slots, {static_cast<int64_t>(slots.size())}));
  }
  // Packed prefill: every sequence at position 0 and more than one of them -> one varlen attention
  // call per layer over the batch's own rows (a sliding layer too when no sequence exceeds its window).
  if (all_at_zero && B > 1) {
    std::vector<int32_t> cu(batch.start.begin(), batch.start.end());
    batch.cu_seqlens = on_device(Tensor::from_vector(cu, {B + 1}));
  }
  // One sequence with a cache: an attention block may write its keys straight into the cache's slots.
  batch.direct_cache = B == 1 && batch.cache[0] != nullptr;
  return batch;
}

}  // namespace

std::string tp_overlap_unused(int tp_size, int64_t batch_tokens) {
  return tp_size < 2 ? "at tp 1 (no all-reduce)" : batch_tokens == 0 ? "with --batch-tokens 0 (one sample per forward)" : "";
}

int64_t overlap_split(const std::vector<std::vector<int32_t>>& ids, const std::vector<KVCache*>& caches, bool tree,
                      int tp) {
  const int64_t B = static_cast<int64_t>(ids.size());
  if (tp < 2 || B < 2 || tree || std::any_of(caches.begin(), caches.end(), [](const KVCache* c) { return c; }))
    return 0;
  int64_t n = 0;
  for (const auto& s : ids) n += static_cast<int64_t>(s.size());
  int64_t best = 1, rows = 0, best_gap = n;
  for (int64_t b = 1; b < B; ++b) {
    rows += static_cast<int64_t>(ids[b - 1].size());
    const int64_t gap = std::abs(2 * rows - n);
    if (gap < best_gap) best = b, best_gap = gap;
  }
  return best;
}

TargetOutput TargetModel::run(const std::vector<std::vector<int32_t>>& ids, const std::vector<KVCache*>& caches,
                              const std::vector<int>& aux_layers, Logits logits, const char* who,
                              const std::vector<int32_t>* tree_parent) {
  Impl& m = *impl_;
  OpProfile& prof = m.profile;
  const int64_t B = static_cast<int64_t>(ids.size());
  const int64_t H = cfg_.hidden_size, N = cfg_.num_hidden_layers;
  const float eps = static_cast<float>(cfg_.rms_norm_eps);
  AERIE_CHECK(B > 0, who << ": empty batch");
  AERIE_CHECK(caches.empty() || static_cast<int64_t>(caches.size()) == B,
              who << ": " << caches.size() << " caches for " << B << " sequences");
  for (int a : aux_layers) AERIE_CHECK(a >= 0 && a <= N, who << ": aux layer " << a << " outside [0, " << N << "]");

  // One micro-batch, or with the tp overlap two (sequences [0, split) and [split, B)), each with its own
  // context: while one micro-batch's all-reduce runs, the other computes.
  const int64_t split = m.tp_overlap ? overlap_split(ids, caches, tree_parent != nullptr, m.tp->size()) : 0;
  std::vector<int64_t> bounds = split > 0 ? std::vector<int64_t>{0, split, B} : std::vector<int64_t>{0, B};
  const size_t G = bounds.size() - 1;
  std::vector<ForwardBatch> batches;
  std::vector<int64_t> row0{0};  // micro-batch g's rows are [row0[g], row0[g + 1]) of the whole batch
  for (size_t g = 0; g < G; ++g) {
    batches.push_back(make_batch(m.layers, m.device, m.dtype, ids, caches, bounds[g], bounds[g + 1], who, tree_parent));
    row0.push_back(row0.back() + batches.back().n);
  }
  const int64_t n = row0.back();

  const Device dev = m.device;
  const DType ct = m.dtype;  // compute dtype: GEMM inputs, KV cache, captured outputs
  std::vector<int32_t> all_ids;
  all_ids.reserve(n);
  for (const auto& s : ids) all_ids.insert(all_ids.end(), s.begin(), s.end());
  Tensor ids_t = Tensor::from_vector(all_ids, {n});
  if (dev != Device::CPU) ids_t = ids_t.to_device(dev);
  std::map<std::string, Tensor> scratch;  // the micro-batches' one pool of dequantized weights
  std::vector<std::unique_ptr<ForwardContext>> ctx;
  for (size_t g = 0; g < G; ++g) {
    ctx.push_back(std::make_unique<ForwardContext>(dev, ct, *m.tp, prof, batches[g], &scratch));
    ctx.back()->defer_reduction = G > 1;
  }

  TargetOutput out;
  if (!aux_layers.empty())
    out.aux_hidden = Tensor::empty({n, H * static_cast<int64_t>(aux_layers.size())}, ct, dev);
  auto capture = [&](int64_t layer, const Tensor& r, size_t g) {
    Tensor rc;  // r in the compute dtype, converted once per captured layer
    Tensor dst = G > 1 ? out.aux_hidden.slice(row0[g], row0[g + 1]) : out.aux_hidden;
    for (size_t j = 0; j < aux_layers.size(); ++j) {
      if (aux_layers[j] != layer) continue;
      if (!rc.defined()) {
        rc = ct == DType::F32 ? r : Tensor::empty(r.shape(), ct, dev);
        if (ct != DType::F32) convert(r, rc);
      }
      copy_columns(rc, 0, dst, static_cast<int64_t>(j) * H, H);
    }
  };

  Tensor r = Tensor::empty({n, H}, DType::F32, dev);  // r^l, the residual stream
  Tensor h = Tensor::empty({n, H}, ct, dev);          // the RMSNorm output feeding a block
  Tensor o = Tensor::empty({n, H}, DType::F32, dev);  // a block's all-reduced update
  prof.time(OpKind::Other, dev, [&] { embedding_forward(ids_t, m.embed_tokens, r); });
  prof.time(OpKind::Norm, dev, [&] { rmsnorm_forward(r, N > 0 ? m.layers[0].input_norm : m.norm, eps, h, nullptr); });
  std::vector<Tensor> rg, hg, og;  // micro-batch g's rows of r, h and o
  for (size_t g = 0; g < G; ++g) {
    rg.push_back(G > 1 ? r.slice(row0[g], row0[g + 1]) : r);
    hg.push_back(G > 1 ? h.slice(row0[g], row0[g + 1]) : h);
    og.push_back(G > 1 ? o.slice(row0[g], row0[g + 1]) : o);
  }
  // Stage 2l is layer l's attention, 2l + 1 its FFN. Before each stage after the first, a micro-batch
  // finishes its previous block's all-reduce and adds the update, fused with the norm the stage reads
  // (post_norm before the FFN, the next layer's input_norm before an attention; after the last, final_norm).
  for (int64_t s = 0; s <= 2 * N; ++s) {
    const int64_t l = s / 2;
    for (size_t g = 0; g < G; ++g) {
      if (s > 0) {
        ctx[g]->finish_reduction();
        const Tensor& w = s == 2 * N ? m.norm : s % 2 ? m.layers[l].post_norm : m.layers[l].input_norm;
        prof.time(OpKind::Norm, dev, [&] { add_rmsnorm_forward(rg[g], og[g], w, eps, hg[g]); });
      }
      if (s % 2 == 0) prof.time(OpKind::Other, dev, [&] { capture(l, rg[g], g); });  // r^l (l = N: r^N)
      if (s == 2 * N) continue;
      if (s % 2 == 0)
        m.layers[l].attn->forward(*ctx[g], l, hg[g], og[g]);
      else
        m.layers[l].ffn->forward(*ctx[g], hg[g], og[g]);
    }
  }
  out.final_hidden = h;  // z = final_norm(r^N)
  ForwardContext& head = *ctx.front();  // the lm_head GEMM (no reduction): any context
  if (logits == Logits::All) {
    out.logits = Tensor::empty({n, m.lm_head.dim(0)}, DType::F32, dev);
    head.gemm(out.final_hidden, m.lm_head, out.logits);
  } else if (logits == Logits::Last) {
    // The last row of each sequence gathered first ([B, H]), then one lm_head GEMM.
    std::vector<int32_t> last;
    for (size_t g = 0; g < G; ++g)
      for (int64_t b = 0; b < batches[g].B; ++b) last.push_back(static_cast<int32_t>(row0[g] + batches[g].start[b + 1] - 1));
    Tensor last_t = Tensor::from_vector(last, {B});
    if (dev != Device::CPU) last_t = last_t.to_device(dev);
    Tensor z_last = Tensor::empty({B, H}, ct, dev);
    prof.time(OpKind::Other, dev, [&] {  // rows < n by construction: no id check, no stream synchronisation
      embedding_forward_in_range(last_t, out.final_hidden, z_last, n);
    });
    out.logits = Tensor::empty({B, m.lm_head.dim(0)}, DType::F32, dev);
    head.gemm(z_last, m.lm_head, out.logits);
  }
  prof.count_forward(n);
  for (const ForwardBatch& batch : batches)
    for (int64_t b = 0; b < batch.B; ++b)
      if (batch.cache[b]) batch.cache[b]->length_ = batch.p0[b] + batch.start[b + 1] - batch.start[b];
  return out;
}

}  // namespace aerie
