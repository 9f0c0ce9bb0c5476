// Loading a draft (export directory or training checkpoint) and greedy chain speculative decoding
// (eagle3.md sections 5-6).
#include <algorithm>
#include <filesystem>

#include "core/log.h"
#include "kernels/loss.h"
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
    ExportedDraft e = load_export(path, target_num_hidden_layers);
    LoadedDraft d{e.config, std::move(e.weights), e.vocab};
    check_vocab(d.vocab, d.cfg.draft_vocab_size, d.cfg.vocab_size, path);
    return d;
  }
  Checkpoint ck = load_checkpoint(resolve_checkpoint(path));
  LoadedDraft d{ck.config, std::move(ck.weights), ck.vocab};
  check_vocab(d.vocab, d.cfg.draft_vocab_size, d.cfg.vocab_size, path);
  return d;
}

namespace {

class DecoderProposer : public Proposer {
 public:
  /// The draft runs where `embed` (the target's table) lives: its weights are copied there when needed.
  DecoderProposer(const LoadedDraft& d, const Tensor& embed, int64_t capacity)
      : moved_(d.weights.device() == embed.device() ? DraftWeights() : d.weights.to_device(embed.device())),
        dec_(d.cfg, d.weights.device() == embed.device() ? d.weights : moved_, embed, d.vocab.d2t, capacity) {}
  void append_verified(const Tensor& aux, const std::vector<int32_t>& next) override { dec_.append_verified(aux, next); }
  std::vector<int32_t> propose(int n) override { return dec_.propose(n); }

 private:
  DraftWeights moved_;  // declared before dec_, which references it
  DraftDecoder dec_;
};

}  // namespace

SpecDecodeResult speculative_generate(TargetModel& target, const LoadedDraft& draft, const std::vector<int32_t>& prompt,
                                      int n, int64_t max_new, const std::vector<int32_t>& stop_ids) {
  const TargetConfig& tc = target.config();
  const DraftConfig& dc = draft.cfg;
  AERIE_CHECK(dc.target_hidden_size == tc.hidden_size && dc.vocab_size == tc.vocab_size,
              "speculative_generate: draft for H_t " << dc.target_hidden_size << ", V " << dc.vocab_size
                                                     << "; target has H " << tc.hidden_size << ", V " << tc.vocab_size);
  std::vector<int> aux = dc.aux_layers.empty() ? default_aux_layers(tc.num_hidden_layers) : dc.aux_layers;
  DecoderProposer prop(draft, target.embed_tokens(), static_cast<int64_t>(prompt.size()) + std::max<int64_t>(max_new, 0) + n + 1);
  return speculative_generate(target, prop, aux, prompt, n, max_new, stop_ids);
}

SpecDecodeResult speculative_generate(TargetModel& target, Proposer& prop, const std::vector<int>& aux,
                                      const std::vector<int32_t>& prompt, int n, int64_t max_new,
                                      const std::vector<int32_t>& stop_ids) {
  const TargetConfig& tc = target.config();
  AERIE_CHECK(!prompt.empty(), "speculative_generate: empty prompt");
  AERIE_CHECK(n >= 1, "speculative_generate: num_draft_tokens " << n << " must be >= 1");
  const int64_t P = static_cast<int64_t>(prompt.size()), capacity = P + max_new + n + 1;
  AERIE_CHECK(tc.max_position_embeddings <= 0 || capacity <= tc.max_position_embeddings,
              "speculative_generate: prompt " << P << " + max_new " << max_new << " + " << n + 1
                                              << " verification positions exceed max_position_embeddings "
                                              << tc.max_position_embeddings);
  Communicator& tp = target.tp();
  auto is_stop = [&](int32_t t) { return std::find(stop_ids.begin(), stop_ids.end(), t) != stop_ids.end(); };

  SpecDecodeResult r;
  r.tokens = prompt;
  r.accepted_at.assign(n, 0);
  if (max_new <= 0) return r;
  KVCache cache = target.make_cache(capacity);
  TargetOutput pre = target.forward(prompt, &cache, aux, true);
  const int32_t first =
      broadcast_token(tp, target.device(), static_cast<int32_t>(argmax_rows(pre.logits.slice(P - 1, P))[0]));
  r.tokens.push_back(first);
  r.generated = 1;
  if (is_stop(first) || max_new == 1) return r;

  prop.append_verified(pre.aux_hidden, std::vector<int32_t>(r.tokens.begin() + 1, r.tokens.end()));
  bool done = false;
  while (!done) {
    // Invariant: the target cache and the draft hold positions 0 .. L-1, L = tokens.size() - 1.
    const int64_t L = static_cast<int64_t>(r.tokens.size()) - 1;
    std::vector<int32_t> guess = broadcast_tokens(tp, target.device(), prop.propose(n));
    AERIE_CHECK(static_cast<int>(guess.size()) == n, "speculative_generate: proposer gave " << guess.size()
                                                                                            << " tokens, asked " << n);
    std::vector<int32_t> in{r.tokens.back()};
    in.insert(in.end(), guess.begin(), guess.end());
    TargetOutput v = target.forward(in, &cache, aux, true);  // positions L .. L+n
    std::vector<int64_t> am = argmax_rows(v.logits);
    std::vector<int32_t> y = broadcast_tokens(tp, target.device(), std::vector<int32_t>(am.begin(), am.end()));
    int a = 0;
    while (a < n && guess[a] == y[a]) ++a;
    ++r.verify_passes;
    // The new tokens g_1..g_a, y_a, cut after a stop token or at max_new. Only the guesses that are
    // emitted count as accepted (a guess cut off at max_new is not part of the output).
    for (int i = 0; i <= a && !done; ++i) {
      const int32_t t = i < a ? guess[i] : y[a];
      if (i < a) ++r.accepted_at[i];
      r.tokens.push_back(t);
      ++r.generated;
      ++r.verify_tokens;
      done = is_stop(t) || r.generated >= max_new;
    }
    if (done) break;
    cache.truncate(L + a + 1);  // x_L and the accepted guesses are verified; y_a is the next input
    prop.append_verified(v.aux_hidden.slice(0, a + 1),
                         std::vector<int32_t>(r.tokens.begin() + L + 1, r.tokens.begin() + L + a + 2));
  }
  return r;
}

}  // namespace aerie
