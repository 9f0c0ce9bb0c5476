// DraftDecoder: the draft at inference with a target-conditioned KV cache (eagle3.md section 6), using
// the same layer and TTT attention code as training (draft_layer.h), so that the chain it proposes is
// the TTT argmax chain whenever the teacher-forced tokens equal its own guesses.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>

#include "kernels/convert.h"
#include "kernels/gemm.h"
#include "kernels/loss.h"
#include "kernels/norm.h"
#include "model/draft.h"
#include "model/draft_layer.h"
#include "model/sampling.h"

namespace aerie {

using draft_detail::LayerActs;
using draft_detail::LayerCtx;

struct DraftDecoder::Impl {
  LayerCtx ctx;
  std::vector<int64_t> d2t;
  int64_t max_len = 0, len = 0;
  Tensor kc, vc;  // [max_len, n_kv, d] step-0 keys (after RoPE) and values
  Tensor oc;      // [max_len, H] step-0 layer outputs o (the hidden of step 1 of a chain starting there)

  Impl(const DraftConfig& c, const DraftWeights& w, const Tensor& e, std::vector<int64_t> d, int64_t m)
      : ctx(c, w, e), d2t(std::move(d)), max_len(m) {}

  /// Picks a draft id from one logits row [1, K] (greedy: its argmax).
  using Pick = std::function<int64_t(const Tensor& logits_row)>;

  int32_t to_target(const Tensor& logits_row, std::vector<std::vector<float>>* out, const Pick& pick) const {
    const int64_t i = pick ? pick(logits_row) : argmax_rows(logits_row)[0];
    if (out) out->push_back(logits_row.to_float_vector());
    return static_cast<int32_t>(i + d2t[i]);
  }

  std::vector<int32_t> chain(int n, std::vector<std::vector<float>>* logits, const Pick& pick);

  /// The step-0 logits [1, K] of the last cached position (a chain's or tree's first guesses).
  Tensor root_logits() const {
    const DraftConfig& c = ctx.cfg;
    Tensor hn = Tensor::empty({1, c.hidden_size}, DType::F32, ctx.device);
    Tensor l = Tensor::empty({1, c.draft_vocab_size}, DType::F32, ctx.device);
    rmsnorm_forward(oc.slice(len - 1, len), ctx.w.norm, static_cast<float>(c.rms_norm_eps), hn, nullptr);
    matmul(hn, ctx.w.lm_head, l, false, true);
    return l;
  }
  /// The hidden [1, H] F32 that a chain from cached position p starts from: its step-0 output o, or
  /// norm(o) under norm_output (what the TTT's step 1 reads).
  Tensor chain_hidden(int64_t p) const {
    Tensor h = oc.slice(p, p + 1).clone();
    if (!ctx.cfg.norm_output) return h;
    Tensor hn = Tensor::empty(h.shape(), DType::F32, ctx.device);
    rmsnorm_forward(h, ctx.w.norm, static_cast<float>(ctx.cfg.rms_norm_eps), hn, nullptr);
    return hn;
  }
  /// One draft step of token `tok` from hidden h [1, H] at position pos, over the cache and the keys
  /// `dk` / `dv` of the earlier steps of its chain or path, to which its own are appended.
  void step(int32_t tok, const Tensor& h, int64_t pos, std::vector<const Tensor*>& dk, std::vector<const Tensor*>& dv,
            LayerActs& a) const {
    const DraftConfig& c = ctx.cfg;
    draft_detail::layer_qkv(ctx, &tok, 1, h, pos, a);
    dk.push_back(&a.k);
    dv.push_back(&a.v);
    a.attn = Tensor::empty({1, c.num_attention_heads, c.attn_qk_dim()}, DType::F32, ctx.device);
    a.lse = Tensor::empty({1, c.num_attention_heads}, DType::F32, ctx.device);
    draft_detail::ttt_attention_forward(a.q, kc.slice(0, len), vc.slice(0, len), dk, dv, len - 1, ctx.scale,
                                        c.sliding_window, a.attn, a.lse);
    draft_detail::layer_out(ctx, a);
  }
};

DraftDecoder::DraftDecoder(const DraftConfig& cfg, const DraftWeights& w, const Tensor& embed_tokens,
                           std::vector<int64_t> d2t, int64_t max_len)
    : impl_(std::make_unique<Impl>(cfg, w, embed_tokens, std::move(d2t), max_len)) {
  AERIE_CHECK(static_cast<int64_t>(impl_->d2t.size()) == cfg.draft_vocab_size,
              "DraftDecoder: d2t has " << impl_->d2t.size() << " entries, K = " << cfg.draft_vocab_size);
  AERIE_CHECK(max_len > 0, "DraftDecoder: max_len " << max_len << " must be positive");
  const int64_t nkv = cfg.attn_kv_heads(), d = cfg.attn_qk_dim();
  // The caches live with the weights (CPU or CUDA).
  const Device dev = impl_->ctx.device;
  impl_->kc = Tensor::zeros({max_len, nkv, d}, DType::F32, dev);
  impl_->vc = Tensor::zeros({max_len, nkv, d}, DType::F32, dev);
  impl_->oc = Tensor::zeros({max_len, cfg.hidden_size}, DType::F32, dev);
}

DraftDecoder::~DraftDecoder() = default;
DraftDecoder::DraftDecoder(DraftDecoder&&) noexcept = default;
DraftDecoder& DraftDecoder::operator=(DraftDecoder&&) noexcept = default;

int64_t DraftDecoder::length() const { return impl_->len; }

void DraftDecoder::truncate(int64_t len) {
  AERIE_CHECK(len >= 0 && len <= impl_->len, "DraftDecoder::truncate(" << len << "): cache holds " << impl_->len);
  impl_->len = len;
}

void DraftDecoder::append_verified(const Tensor& aux_hidden, const std::vector<int32_t>& next_tokens) {
  Impl& m = *impl_;
  const DraftConfig& c = m.ctx.cfg;
  const int64_t n = static_cast<int64_t>(next_tokens.size()), p0 = m.len;
  if (n == 0) return;
  aux_hidden.check_shape({n, 3 * c.target_hidden_size}, "DraftDecoder::append_verified: aux_hidden");
  AERIE_CHECK(p0 + n <= m.max_len, "DraftDecoder::append_verified: " << p0 << " + " << n << " positions exceed max_len "
                                                                    << m.max_len);
  const Device dev = m.ctx.device;
  Tensor aux = aux_hidden.device() == dev ? aux_hidden : aux_hidden.to_device(dev);
  if (aux.dtype() != DType::F32) {  // a BF16 target's aux hidden states: widened exactly
    Tensor f = Tensor::empty(aux.shape(), DType::F32, dev);
    convert(aux, f);
    aux = f;
  }
  const Tensor g = draft_detail::layer_fc(m.ctx, aux, nullptr);  // fc(f), or fc(input_norm(f)) (norm_before_fc)
  LayerActs a;
  draft_detail::layer_qkv(m.ctx, next_tokens.data(), n, g, p0, a);
  m.kc.slice(p0, p0 + n).copy_from(a.k);
  m.vc.slice(p0, p0 + n).copy_from(a.v);
  a.attn = Tensor::empty({n, c.num_attention_heads, c.attn_qk_dim()}, DType::F32, dev);
  a.lse = Tensor::empty({n, c.num_attention_heads}, DType::F32, dev);
  // Row i (position p0+i) attends to the cached keys 0 .. p0+i (the last sliding_window of them): TTT step 0.
  draft_detail::ttt_attention_forward(a.q, m.kc.slice(0, p0 + n), m.vc.slice(0, p0 + n), {}, {}, p0, m.ctx.scale,
                                      c.sliding_window, a.attn, a.lse);
  draft_detail::layer_out(m.ctx, a);
  m.oc.slice(p0, p0 + n).copy_from(a.o);
  m.len = p0 + n;
}

std::vector<int32_t> DraftDecoder::propose(int n, std::vector<std::vector<float>>* logits) {
  return impl_->chain(n, logits, nullptr);
}

std::vector<int32_t> DraftDecoder::propose_sampled(int n, const SamplingParams& p, SampleRng& rng,
                                                   std::vector<std::vector<double>>* q) {
  check_sampling_params(p);
  if (q) q->clear();
  return impl_->chain(n, nullptr, [&](const Tensor& row) -> int64_t {
    const std::vector<float> l = row.to_float_vector();
    const int64_t K = static_cast<int64_t>(l.size());
    std::vector<double> dist = sampling_distribution(l.data(), K, p);
    // One uniform draw against the distribution's cumulative sums in id order (what sample_token does at
    // top_p = 1; here for any top_p, so that the drawn id always has q > 0).
    int64_t pick = -1;
    if (p.temperature == 0) {
      for (int64_t i = 0; i < K && pick < 0; ++i)
        if (dist[i] == 1.0) pick = i;
    } else {
      const double u = rng.uniform();
      double cum = 0;
      for (int64_t i = 0; i < K && pick < 0; ++i) {
        cum += dist[i];
        if (u < cum) pick = i;
      }
      for (int64_t i = K - 1; pick < 0 && i >= 0; --i)  // u within rounding of 1: the last id with mass
        if (dist[i] > 0) pick = i;
    }
    if (q) q->push_back(std::move(dist));
    return pick;
  });
}

DraftTree DraftDecoder::propose_tree(int budget, int topk, int depth) {
  Impl& m = *impl_;
  const DraftConfig& c = m.ctx.cfg;
  AERIE_CHECK(budget >= 1 && topk >= 1 && depth >= 1, "DraftDecoder::propose_tree: budget " << budget << ", topk "
                                                                                           << topk << ", depth " << depth);
  AERIE_CHECK(m.len >= 1, "DraftDecoder::propose_tree: the cache is empty (append_verified first)");
  const int64_t p = m.len - 1, K = c.draft_vocab_size;
  struct Node {
    int32_t parent, depth;
    int64_t draft_id;
    double score;
    Tensor k, v, o;  // its step's key, value and output: set when it is expanded
  };
  std::vector<Node> nodes;
  // The top-k draft ids of one logits row [1, K] and their log-probabilities (ties: the smaller id).
  auto top = [&](const Tensor& logits) {
    const std::vector<float> l = logits.to_float_vector();
    const float mx = *std::max_element(l.begin(), l.end());
    double z = 0;
    for (float x : l) z += std::exp(static_cast<double>(x) - mx);
    const double lz = std::log(z) + mx;
    // One pass keeping the kk best ids sorted (insertion): the order partial_sort gives, without
    // sorting a K-entry id array per expanded node.
    const int64_t kk = std::min<int64_t>(topk, K);
    auto better = [&](int64_t a, int64_t b) { return l[a] > l[b] || (l[a] == l[b] && a < b); };
    std::vector<int64_t> ids;
    ids.reserve(static_cast<size_t>(kk) + 1);
    for (int64_t i = 0; i < K; ++i) {
      if (static_cast<int64_t>(ids.size()) == kk && !better(i, ids.back())) continue;
      auto at = std::upper_bound(ids.begin(), ids.end(), i, better);
      ids.insert(at, i);
      if (static_cast<int64_t>(ids.size()) > kk) ids.pop_back();
    }
    std::vector<std::pair<int64_t, double>> out;
    for (int64_t i = 0; i < kk; ++i) out.emplace_back(ids[i], static_cast<double>(l[ids[i]]) - lz);
    return out;
  };
  // Depth 1: the root's distribution, from the step-0 output of the last cached position.
  const Tensor h0 = m.chain_hidden(p);
  for (const auto& [id, lp] : top(m.root_logits())) nodes.push_back({-1, 1, id, lp, {}, {}, {}});
  std::vector<int32_t> frontier(nodes.size());
  for (size_t i = 0; i < frontier.size(); ++i) frontier[i] = static_cast<int32_t>(i);
  auto by_score = [&](int32_t a, int32_t b) { return nodes[a].score > nodes[b].score || (nodes[a].score == nodes[b].score && a < b); };
  for (int d = 2; d <= depth; ++d) {
    std::vector<int32_t> made;
    for (const int32_t f : frontier) {
      // Expand f: the draft step of its token at position p + depth(f), from its parent's output, over
      // the cache and the keys of its ancestors' steps and its own.
      std::vector<int32_t> path;
      for (int32_t x = f; x >= 0; x = nodes[x].parent) path.push_back(x);
      std::reverse(path.begin(), path.end());
      const int32_t tok = static_cast<int32_t>(nodes[f].draft_id + m.d2t[nodes[f].draft_id]);
      std::vector<const Tensor*> dk, dv;  // its ancestors' keys, then its own
      for (size_t j = 0; j + 1 < path.size(); ++j) {
        dk.push_back(&nodes[path[j]].k);
        dv.push_back(&nodes[path[j]].v);
      }
      LayerActs a;
      m.step(tok, nodes[f].parent < 0 ? h0 : nodes[nodes[f].parent].o, p + nodes[f].depth, dk, dv, a);
      nodes[f].k = a.k;
      nodes[f].v = a.v;
      nodes[f].o = draft_detail::next_hidden(a);
      const double base = nodes[f].score;
      for (const auto& [id, lp] : top(a.logits)) {
        made.push_back(static_cast<int32_t>(nodes.size()));
        nodes.push_back({f, d, id, base + lp, {}, {}, {}});
      }
    }
    std::stable_sort(made.begin(), made.end(), by_score);
    if (static_cast<int>(made.size()) > topk) made.resize(topk);
    frontier = made;
  }
  // The budget best nodes, then breadth-first (by depth, then score order).
  std::vector<int32_t> order(nodes.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int32_t>(i);
  std::stable_sort(order.begin(), order.end(), by_score);
  if (static_cast<int>(order.size()) > budget) order.resize(budget);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return nodes[a].depth < nodes[b].depth; });
  std::vector<int32_t> where(nodes.size(), -1);
  for (size_t i = 0; i < order.size(); ++i) where[order[i]] = static_cast<int32_t>(i);
  DraftTree t;
  for (const int32_t x : order) {
    const Node& nd = nodes[x];
    AERIE_CHECK(nd.parent < 0 || where[nd.parent] >= 0, "DraftDecoder::propose_tree: a node without its parent");
    t.tokens.push_back(static_cast<int32_t>(nd.draft_id + m.d2t[nd.draft_id]));
    t.parent.push_back(nd.parent < 0 ? -1 : where[nd.parent]);
  }
  return t;
}

std::vector<int32_t> DraftDecoder::Impl::chain(int n, std::vector<std::vector<float>>* logits, const Pick& pick) {
  Impl& m = *this;
  AERIE_CHECK(n >= 1, "DraftDecoder::propose: n = " << n);
  AERIE_CHECK(m.len >= 1, "DraftDecoder::propose: the cache is empty (append_verified first)");
  const int64_t p = m.len - 1;
  if (logits) logits->clear();
  // Guess 1: the step-0 logits of the last cached position.
  Tensor h = m.chain_hidden(p);
  std::vector<int32_t> out{m.to_target(m.root_logits(), logits, pick)};
  // Guess j+1 from step j at position p+j: the cache 0..p plus the chain's own keys of steps 1..j.
  std::vector<LayerActs> chain(n);  // sized once: dk / dv point into it
  std::vector<const Tensor*> dk, dv;
  for (int j = 1; j < n; ++j) {
    LayerActs& a = chain[j];
    m.step(out.back(), h, p + j, dk, dv, a);
    out.push_back(m.to_target(a.logits, logits, pick));
    h = draft_detail::next_hidden(a);
  }
  return out;
}

}  // namespace aerie
