// Loading a draft (export directory or training checkpoint) and greedy chain speculative decoding
// (eagle3.md sections 5-6).
#include <algorithm>
#include <filesystem>

#include "core/log.h"
#include "kernels/loss.h"
#include "model/sampling.h"
#include "model/target_config.h"
#include "train/checkpoint.h"
#include "train/eval.h"
#include "train/export.h"

namespace aerie {

namespace fs = std::filesystem;

namespace {

void check_vocab(const DraftVocab& v, int64_t K, int64_t V, const std::string& where) {
  AERIE_CHECK(v.draft_vocab_size() == K && v.vocab_size() == V,
              where << ": d2t has " << v.draft_vocab_size() << " entries (K = " << K << "), t2d " << v.vocab_size()
                    << " (V = " << V << ")");
  int64_t prev = -1, ones = 0;
  for (int64_t i = 0; i < K; ++i) {
    const int64_t s = i + v.d2t[i];
    AERIE_CHECK(s > prev && s < V && v.t2d[s], where << ": d2t[" << i << "] = " << v.d2t[i] << " gives target id " << s
                                                     << ", not ascending/inside V/selected in t2d");
    prev = s;
  }
  for (uint8_t b : v.t2d) ones += b != 0;
  AERIE_CHECK(ones == K, where << ": t2d selects " << ones << " ids, K = " << K);
}

// Tp rank 0's ids to every rank of the group, through the model's device (a GPU model's tp group is an
// NCCL communicator, which takes device tensors).
std::vector<int32_t> broadcast_tokens(Communicator& tp, Device dev, std::vector<int32_t> v) {
  if (tp.size() == 1 || v.empty()) return v;
  Tensor t = Tensor::from_vector(v, {static_cast<int64_t>(v.size())});
  if (dev != Device::CPU) t = t.to_device(dev);
  tp.broadcast(t, 0);
  if (t.device() != Device::CPU) t = t.to_device(Device::CPU);
  return std::vector<int32_t>(t.data<int32_t>(), t.data<int32_t>() + v.size());
}

int32_t broadcast_token(Communicator& tp, Device dev, int32_t v) { return broadcast_tokens(tp, dev, {v})[0]; }

}  // namespace

LoadedDraft load_draft(const std::string& path, int64_t target_num_hidden_layers) {
  if (fs::exists(fs::path(path) / "model.safetensors") && fs::exists(fs::path(path) / "config.json")) {
    const nlohmann::json cfg = nlohmann::json::parse(read_file((fs::path(path) / "config.json").string()), nullptr, false);
    ExportedDraft e = [&] {
      try {
        return load_export(path, target_num_hidden_layers);
      } catch (const Error& err) {
        // A target model's folder given as the draft (eval --draft MODEL) fails on a missing draft tensor:
        // say what the folder is.
        if (cfg.is_object() && eagle_draft_marker(cfg).empty() && cfg.contains("num_hidden_layers"))
          AERIE_THROW(path << " looks like a target model's folder (its config.json names no EAGLE draft"
                           << (cfg.contains("architectures") ? ": architectures " + cfg["architectures"].dump() : std::string())
                           << "), not a draft export of aerie export, SpecForge or speculators (" << err.what() << ")");
        throw;
      }
    }();
    // An export of aerie records the checkpoint it came from and that checkpoint's target.
    nlohmann::json prov;
    if (cfg.is_object() && cfg.contains("aerie_checkpoint") && cfg["aerie_checkpoint"].is_object() &&
        cfg["aerie_checkpoint"].contains("target"))
      prov = {{"target", cfg["aerie_checkpoint"]["target"]}};
    LoadedDraft d{e.config, std::move(e.weights), e.vocab, prov};
    check_vocab(d.vocab, d.cfg.draft_vocab_size, d.cfg.vocab_size, path);
    return d;
  }
  Checkpoint ck = load_checkpoint(resolve_checkpoint(path), /*optimizer_state=*/false);
  LoadedDraft d{ck.config, std::move(ck.weights), ck.vocab, ck.provenance};
  check_vocab(d.vocab, d.cfg.draft_vocab_size, d.cfg.vocab_size, path);
  return d;
}

namespace {

class DecoderProposer : public Proposer {
 public:
  /// The draft runs where `embed` (the target's table) lives: its weights are copied there when needed.
  DecoderProposer(const LoadedDraft& d, const Tensor& embed, int64_t capacity)
      : moved_(d.weights.device() == embed.device() ? DraftWeights() : d.weights.to_device(embed.device())),
        dec_(d.cfg, d.weights.device() == embed.device() ? d.weights : moved_, embed, d.vocab.d2t, capacity),
        d2t_(d.vocab.d2t) {}
  void append_verified(const Tensor& aux, const std::vector<int32_t>& next) override { dec_.append_verified(aux, next); }
  std::vector<int32_t> propose(int n) override { return dec_.propose(n); }
  DraftTree propose_tree(int budget, int topk, int depth) override { return dec_.propose_tree(budget, topk, depth); }
  std::vector<int32_t> propose_sampled(int n, const SamplingParams& p, SampleRng& rng,
                                       std::vector<DraftDist>& q) override {
    std::vector<std::vector<double>> qk;  // [n][K] over draft ids
    std::vector<int32_t> g = dec_.propose_sampled(n, p, rng, &qk);
    q.assign(qk.size(), DraftDist{});
    for (size_t i = 0; i < qk.size(); ++i)
      for (size_t k = 0; k < qk[i].size(); ++k)
        if (qk[i][k] > 0) {
          q[i].ids.push_back(static_cast<int32_t>(static_cast<int64_t>(k) + d2t_[k]));
          q[i].probs.push_back(qk[i][k]);
        }
    return g;
  }

 private:
  DraftWeights moved_;  // declared before dec_, which references it
  DraftDecoder dec_;
  std::vector<int64_t> d2t_;
};

}  // namespace

std::vector<int32_t> Proposer::propose_sampled(int n, const SamplingParams&, SampleRng&, std::vector<DraftDist>& q) {
  std::vector<int32_t> g = propose(n);
  q.assign(g.size(), DraftDist{});
  for (size_t i = 0; i < g.size(); ++i) q[i] = DraftDist{{g[i]}, {1.0}};
  return g;
}

DraftTree Proposer::propose_tree(int budget, int, int depth) {
  DraftTree t;
  t.tokens = propose(std::min(budget, depth));
  for (size_t i = 0; i < t.tokens.size(); ++i) t.parent.push_back(static_cast<int32_t>(i) - 1);
  return t;
}

namespace {

/// One draw from an unnormalised distribution `w` [V] (weights >= 0, some > 0): the first id, in id
/// order, whose cumulative weight exceeds u * total (one rng.uniform()).
int32_t draw(const std::vector<double>& w, SampleRng& rng) {
  double total = 0;
  for (double x : w) total += x;
  const double u = rng.uniform() * total;
  double cum = 0;
  int32_t last = -1;
  for (size_t i = 0; i < w.size(); ++i)
    if (w[i] > 0) {
      cum += w[i];
      last = static_cast<int32_t>(i);
      if (u < cum) return last;
    }
  return last;  // u within rounding of the total
}

}  // namespace

std::vector<int32_t> accept_speculative_sampling(const std::vector<std::vector<double>>& p,
                                                 const std::vector<DraftDist>& q, const std::vector<int32_t>& g,
                                                 SampleRng& rng) {
  const size_t n = g.size();
  AERIE_CHECK(q.size() == n && p.size() == n + 1, "accept_speculative_sampling: " << n << " guesses, " << q.size()
                                                                                   << " draft and " << p.size()
                                                                                   << " target distributions");
  const size_t V = p[0].size();
  for (const auto& row : p) AERIE_CHECK(row.size() == V, "accept_speculative_sampling: target rows of unequal size");
  std::vector<int32_t> out;
  for (size_t i = 0; i < n; ++i) {
    AERIE_CHECK(g[i] >= 0 && static_cast<size_t>(g[i]) < V, "accept_speculative_sampling: guess " << i << " = " << g[i]
                                                                                                 << " outside V " << V);
    AERIE_CHECK(q[i].ids.size() == q[i].probs.size(), "accept_speculative_sampling: draft distribution " << i
                                                                                                        << " malformed");
    double qg = 0;
    for (size_t k = 0; k < q[i].ids.size(); ++k)
      if (q[i].ids[k] == g[i]) qg += q[i].probs[k];
    AERIE_CHECK(qg > 0, "accept_speculative_sampling: guess " << i << " (id " << g[i]
                                                              << ") has probability 0 under its draft distribution");
    if (rng.uniform() < p[i][g[i]] / qg) {  // accepted with probability min(1, p/q)
      out.push_back(g[i]);
      continue;
    }
    std::vector<double> r = p[i];  // the residual max(0, p - q)
    for (size_t k = 0; k < q[i].ids.size(); ++k) {
      const int32_t id = q[i].ids[k];
      AERIE_CHECK(id >= 0 && static_cast<size_t>(id) < V, "accept_speculative_sampling: draft id " << id
                                                                                                  << " outside V " << V);
      r[id] = std::max(0.0, r[id] - q[i].probs[k]);
    }
    double mass = 0;
    for (double x : r) mass += x;
    out.push_back(draw(mass > 0 ? r : p[i], rng));
    return out;
  }
  out.push_back(draw(p[n], rng));  // every guess accepted: the bonus token
  return out;
}

SpecDecodeResult speculative_generate(TargetModel& target, const LoadedDraft& draft, const std::vector<int32_t>& prompt,
                                      int n, int64_t max_new, const std::vector<int32_t>& stop_ids) {
  SpecDecodeOptions o;
  o.num_draft_tokens = n;
  o.max_new = max_new;
  o.stop_ids = stop_ids;
  return speculative_generate(target, draft, prompt, o);
}

SpecDecodeResult speculative_generate(TargetModel& target, const LoadedDraft& draft, const std::vector<int32_t>& prompt,
                                      const SpecDecodeOptions& o) {
  const TargetConfig& tc = target.config();
  const DraftConfig& dc = draft.cfg;
  AERIE_CHECK(dc.target_hidden_size == tc.hidden_size && dc.vocab_size == tc.vocab_size,
              "speculative_generate: draft for H_t " << dc.target_hidden_size << ", V " << dc.vocab_size
                                                     << "; target has H " << tc.hidden_size << ", V " << tc.vocab_size);
  std::vector<int> aux = dc.aux_layers.empty() ? default_aux_layers(tc.num_hidden_layers) : dc.aux_layers;
  DecoderProposer prop(draft, target.embed_tokens(),
                       static_cast<int64_t>(prompt.size()) + std::max<int64_t>(o.max_new, 0) + o.num_draft_tokens + 1);
  return speculative_generate(target, prop, aux, prompt, o);
}

SpecDecodeResult speculative_generate(TargetModel& target, Proposer& prop, const std::vector<int>& aux,
                                      const std::vector<int32_t>& prompt, int n, int64_t max_new,
                                      const std::vector<int32_t>& stop_ids) {
  SpecDecodeOptions o;
  o.num_draft_tokens = n;
  o.max_new = max_new;
  o.stop_ids = stop_ids;
  return speculative_generate(target, prop, aux, prompt, o);
}

namespace {

// The rows of a verified draft tree that the target accepts: the longest path of the target's argmaxes,
// from the root (row 0), each row the child (parent[c]: its parent row) whose token in[c] is y of its
// parent. Returns the rows from the root on (at least {0}).
std::vector<int64_t> accepted_tree_path(const std::vector<int32_t>& in, const std::vector<int32_t>& parent,
                                        const std::vector<int32_t>& y) {
  std::vector<int64_t> rows{0};
  for (bool more = true; more;) {
    more = false;
    for (size_t c = 1; c < in.size() && !more; ++c)
      if (parent[c] == rows.back() && in[c] == y[rows.back()]) {
        rows.push_back(static_cast<int64_t>(c));
        more = true;
      }
  }
  return rows;
}

// Appends a pass's emitted tokens (the accepted guesses, then the target's token) to r, counting the accepted
// positions, and cuts after a stop id or at max_new: a guess cut off is not part of the output, nor accepted.
// Returns true when the run is done.
bool append_emitted(SpecDecodeResult& r, const std::vector<int32_t>& emitted,
                    const std::function<bool(int32_t)>& is_stop, int64_t max_new) {
  const int a = static_cast<int>(emitted.size()) - 1;
  ++r.verify_passes;
  bool done = false;
  for (int i = 0; i <= a && !done; ++i) {
    if (i < a) ++r.accepted_at[i];
    r.tokens.push_back(emitted[i]);
    ++r.generated;
    ++r.verify_tokens;
    done = is_stop(emitted[i]) || r.generated >= max_new;
  }
  return done;
}

// One pass of tree verification (SpecDecodeOptions::tree_topk > 1) at L = r.tokens.size() - 1: the proposer's
// tree verified in one forward_tree, the longest accepted path and the target's next token appended to r (cut at
// a stop id or max_new), the caches kept to that path. Returns true when the run is done.
bool tree_pass(TargetModel& target, Proposer& prop, const std::vector<int>& aux, const SpecDecodeOptions& o,
               int tree_depth, KVCache& cache, SpecDecodeResult& r, const std::function<bool(int32_t)>& is_stop,
               int64_t max_new) {
  Communicator& tp = target.tp();
  const int n = o.num_draft_tokens;
  const int64_t L = static_cast<int64_t>(r.tokens.size()) - 1;
  DraftTree t = prop.propose_tree(n, o.tree_topk, tree_depth);
  AERIE_CHECK(!t.tokens.empty() && static_cast<int>(t.tokens.size()) <= n && t.parent.size() == t.tokens.size(),
              "speculative_generate: proposer gave a tree of " << t.tokens.size() << " nodes (budget " << n << ")");
  std::vector<int32_t> size = broadcast_tokens(tp, target.device(), {static_cast<int32_t>(t.tokens.size())});
  t.tokens.resize(size[0]);
  t.parent.resize(size[0]);
  t.tokens = broadcast_tokens(tp, target.device(), t.tokens);
  t.parent = broadcast_tokens(tp, target.device(), t.parent);
  std::vector<int32_t> in{r.tokens.back()}, parent{-1};  // row 0: the root, x_L
  for (size_t i = 0; i < t.tokens.size(); ++i) {
    in.push_back(t.tokens[i]);
    parent.push_back(t.parent[i] + 1);
  }
  TargetOutput v = target.forward_tree(in, parent, &cache, aux, true);  // rows at positions L + depth
  std::vector<int64_t> am = argmax_rows(v.logits);
  std::vector<int32_t> y = broadcast_tokens(tp, target.device(), std::vector<int32_t>(am.begin(), am.end()));
  const std::vector<int64_t> rows = accepted_tree_path(in, parent, y);
  const int a = static_cast<int>(rows.size()) - 1;
  std::vector<int32_t> emitted;
  for (int i = 0; i < a; ++i) emitted.push_back(in[rows[i + 1]]);
  emitted.push_back(y[rows[a]]);
  if (append_emitted(r, emitted, is_stop, max_new)) return true;
  cache.keep_rows(L, rows);  // x_L and the accepted path, as positions L .. L + a
  Tensor f = Tensor::empty({a + 1, v.aux_hidden.dim(1)}, v.aux_hidden.dtype(), v.aux_hidden.device());
  for (int i = 0; i <= a; ++i) f.slice(i, i + 1).copy_from(v.aux_hidden.slice(rows[i], rows[i] + 1));
  prop.append_verified(f, std::vector<int32_t>(r.tokens.begin() + L + 1, r.tokens.begin() + L + a + 2));
  return false;
}

}  // namespace

SpecDecodeResult speculative_generate(TargetModel& target, Proposer& prop, const std::vector<int>& aux,
                                      const std::vector<int32_t>& prompt, const SpecDecodeOptions& o) {
  const TargetConfig& tc = target.config();
  const int n = o.num_draft_tokens;
  AERIE_CHECK(!prompt.empty(), "speculative_generate: empty prompt");
  AERIE_CHECK(n >= 1, "speculative_generate: num_draft_tokens " << n << " must be >= 1");
  check_sampling_params(o.sampling);
  const bool follow = !o.follow.empty();
  const int64_t max_new = follow ? std::min<int64_t>(o.max_new, static_cast<int64_t>(o.follow.size())) : o.max_new;
  const int64_t P = static_cast<int64_t>(prompt.size()), capacity = P + max_new + n + 1;
  AERIE_CHECK(tc.max_position_embeddings <= 0 || capacity <= tc.max_position_embeddings,
              "speculative_generate: prompt " << P << " + max_new " << max_new << " + " << n + 1
                                              << " verification positions exceed max_position_embeddings "
                                              << tc.max_position_embeddings);
  Communicator& tp = target.tp();
  const bool sampled = o.sampling.temperature > 0, root = tp.rank() == 0;
  const bool tree = o.tree_topk > 1;
  AERIE_CHECK(o.tree_topk >= 1 && o.tree_depth >= 0, "speculative_generate: tree topk " << o.tree_topk << ", depth "
                                                                                          << o.tree_depth);
  AERIE_CHECK(!(tree && sampled), "speculative_generate: draft trees verify greedily (temperature 0) for now; "
                                  "sampled speculation takes chains (tree topk 1)");
  AERIE_CHECK(!follow || (!tree && !sampled), "speculative_generate: a followed continuation goes with greedy chains "
                                              "(temperature 0, tree topk 1)");
  SampleRng rng(o.seed);
  const AcceptRule accept = o.accept ? o.accept : AcceptRule(accept_speculative_sampling);
  auto is_stop = [&](int32_t t) { return std::find(o.stop_ids.begin(), o.stop_ids.end(), t) != o.stop_ids.end(); };
  // Rows r0 .. r1-1 of a logits tensor [*, V] as host F32.
  auto host_logits = [](const Tensor& logits, int64_t r0, int64_t r1) {
    Tensor l = logits.slice(r0, r1);
    if (l.device() != Device::CPU) l = l.to_device(Device::CPU);
    return l.to_float_vector();
  };

  SpecDecodeResult r;
  r.tokens = prompt;
  const int tree_depth = tree ? std::min(o.tree_depth > 0 ? o.tree_depth : n, n) : n;
  r.accepted_at.assign(tree_depth, 0);  // a tree accepts at most its depth
  if (max_new <= 0) return r;
  KVCache cache = target.make_cache(capacity);
  TargetOutput pre = target.forward(prompt, &cache, aux, true);
  int32_t first = 0;
  // With o.follow, the target's choice for new token g is the followed token (-1 past its end: no guess
  // equals it, and the run stops before emitting it); its own argmax there is only compared (a row whose
  // input holds the followed text so far).
  auto followed = [&](int64_t g) { return g < static_cast<int64_t>(o.follow.size()) ? o.follow[g] : -1; };
  auto note_own = [&](int64_t g, int32_t own) {
    if (followed(g) >= 0 && own != followed(g) && r.own_first_difference < 0) r.own_first_difference = g;
  };
  if (!sampled) {
    first = static_cast<int32_t>(argmax_rows(pre.logits.slice(P - 1, P))[0]);
    if (follow) {
      note_own(0, first);
      first = followed(0);
    }
  } else if (root) {
    const std::vector<float> l = host_logits(pre.logits, P - 1, P);
    first = sample_token(l.data(), static_cast<int64_t>(l.size()), o.sampling, rng);
  }
  first = broadcast_token(tp, target.device(), first);
  r.tokens.push_back(first);
  r.generated = 1;
  if (is_stop(first) || max_new == 1) return r;

  prop.append_verified(pre.aux_hidden, std::vector<int32_t>(r.tokens.begin() + 1, r.tokens.end()));
  bool done = false;
  while (!done) {
    // Invariant: the target cache and the draft hold positions 0 .. L-1, L = tokens.size() - 1.
    const int64_t L = static_cast<int64_t>(r.tokens.size()) - 1;
    if (tree) {  // one pass of tree verification
      if (tree_pass(target, prop, aux, o, tree_depth, cache, r, is_stop, max_new)) break;
      continue;
    }
    std::vector<DraftDist> q;
    std::vector<int32_t> guess = sampled ? prop.propose_sampled(n, o.sampling, rng, q) : prop.propose(n);
    AERIE_CHECK(static_cast<int>(guess.size()) == n, "speculative_generate: proposer gave " << guess.size()
                                                                                            << " tokens, asked " << n);
    guess = broadcast_tokens(tp, target.device(), guess);
    std::vector<int32_t> in{r.tokens.back()};
    in.insert(in.end(), guess.begin(), guess.end());
    TargetOutput v = target.forward(in, &cache, aux, true);  // positions L .. L+n
    // emitted: the accepted guesses g_1..g_a, then the target's token (greedy: y_a; sampled: the rule's).
    std::vector<int32_t> emitted;
    if (!sampled) {
      std::vector<int64_t> am = argmax_rows(v.logits);
      std::vector<int32_t> y = broadcast_tokens(tp, target.device(), std::vector<int32_t>(am.begin(), am.end()));
      const std::vector<int32_t> own = y;
      if (follow)
        for (int i = 0; i <= n; ++i) y[i] = followed(r.generated + i);  // row i: new token generated + i
      int a = 0;
      while (a < n && guess[a] == y[a]) ++a;
      if (follow)
        for (int i = 0; i <= a; ++i) note_own(r.generated + i, own[i]);  // rows fed the followed text
      emitted.assign(guess.begin(), guess.begin() + a);
      emitted.push_back(y[a]);
    } else {
      std::vector<int32_t> e(n + 1, -1);  // tp rank 0 decides; -1 pads the tokens it did not emit
      if (root) {
        const std::vector<float> l = host_logits(v.logits, 0, n + 1);
        const int64_t V = static_cast<int64_t>(l.size()) / (n + 1);
        std::vector<std::vector<double>> p;
        for (int i = 0; i <= n; ++i) p.push_back(sampling_distribution(l.data() + i * V, V, o.sampling));
        const std::vector<int32_t> out = accept(p, q, guess, rng);
        AERIE_CHECK(!out.empty() && static_cast<int>(out.size()) <= n + 1,
                    "speculative_generate: the accept rule emitted " << out.size() << " tokens (1 to " << n + 1 << ")");
        for (size_t i = 0; i + 1 < out.size(); ++i)
          AERIE_CHECK(out[i] == guess[i], "speculative_generate: the accept rule's token " << i << " (" << out[i]
                                                                                          << ") is not guess " << i);
        std::copy(out.begin(), out.end(), e.begin());
      }
      e = broadcast_tokens(tp, target.device(), e);
      for (int32_t t : e)
        if (t >= 0) emitted.push_back(t);
    }
    const int a = static_cast<int>(emitted.size()) - 1;
    done = append_emitted(r, emitted, is_stop, max_new);
    if (done) break;
    cache.truncate(L + a + 1);  // x_L and the accepted guesses are verified; the last token is the next input
    prop.append_verified(v.aux_hidden.slice(0, a + 1),
                         std::vector<int32_t>(r.tokens.begin() + L + 1, r.tokens.begin() + L + a + 2));
  }
  return r;
}

}  // namespace aerie
