#include "model/sampling.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/error.h"
#include "model/llama.h"

namespace aerie {

void check_sampling_params(const SamplingParams& p) {
  AERIE_CHECK(std::isfinite(p.temperature) && p.temperature >= 0,
              "sampling: temperature must be >= 0, got " << p.temperature);
  AERIE_CHECK(p.top_p > 0 && p.top_p <= 1, "sampling: top-p must lie in (0, 1], got " << p.top_p);
}

uint64_t SampleRng::next() {
  uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

double SampleRng::uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }

uint64_t sequence_seed(uint64_t seed, uint64_t index) {
  SampleRng a(seed);
  SampleRng b(a.next() ^ (index * 0xD1B54A32D192ED03ull));
  return b.next();
}

namespace {

int32_t argmax(const float* x, int64_t V) {
  int64_t best = 0;
  for (int64_t i = 1; i < V; ++i)
    if (x[i] > x[best]) best = i;
  return static_cast<int32_t>(best);
}

// Token ids of the nucleus in order of decreasing probability (ties by id) and their probabilities,
// renormalised to sum 1. probs: softmax(logits / T) in double.
void nucleus(const float* logits, int64_t V, const SamplingParams& p, std::vector<int32_t>& ids,
             std::vector<double>& probs) {
  const double inv_t = 1.0 / p.temperature;
  double mx = -INFINITY;
  for (int64_t i = 0; i < V; ++i) mx = std::max(mx, static_cast<double>(logits[i]) * inv_t);
  std::vector<double> e(static_cast<size_t>(V));
  double sum = 0;
  for (int64_t i = 0; i < V; ++i) sum += e[i] = std::exp(static_cast<double>(logits[i]) * inv_t - mx);
  ids.resize(static_cast<size_t>(V));
  std::iota(ids.begin(), ids.end(), 0);
  if (p.top_p < 1) {
    auto by_prob = [&](int32_t a, int32_t b) { return e[a] != e[b] ? e[a] > e[b] : a < b; };
    std::sort(ids.begin(), ids.end(), by_prob);
    // Smallest prefix whose mass reaches top_p (the token that crosses it is kept).
    double mass = 0;
    size_t keep = 0;
    while (keep < ids.size()) {
      mass += e[ids[keep++]] / sum;
      if (mass >= p.top_p) break;
    }
    ids.resize(keep);
    sum = 0;
    for (int32_t i : ids) sum += e[i];
  }
  probs.resize(ids.size());
  for (size_t k = 0; k < ids.size(); ++k) probs[k] = e[ids[k]] / sum;
}

}  // namespace

std::vector<double> sampling_distribution(const float* logits, int64_t V, const SamplingParams& p) {
  AERIE_CHECK(V > 0, "sampling: empty logits row (V = " << V << ")");
  check_sampling_params(p);
  std::vector<double> out(static_cast<size_t>(V), 0.0);
  if (p.temperature == 0) {
    out[argmax(logits, V)] = 1.0;
    return out;
  }
  std::vector<int32_t> ids;
  std::vector<double> probs;
  nucleus(logits, V, p, ids, probs);
  for (size_t k = 0; k < ids.size(); ++k) out[ids[k]] = probs[k];
  return out;
}

int32_t sample_token(const float* logits, int64_t V, const SamplingParams& p, SampleRng& rng) {
  AERIE_CHECK(V > 0, "sampling: empty logits row (V = " << V << ")");
  check_sampling_params(p);
  if (p.temperature == 0) return argmax(logits, V);
  std::vector<int32_t> ids;
  std::vector<double> probs;
  nucleus(logits, V, p, ids, probs);
  const double u = rng.uniform();
  double cum = 0;
  for (size_t k = 0; k < ids.size(); ++k) {
    cum += probs[k];
    if (u < cum) return ids[k];
  }
  return ids.back();  // u within rounding of 1
}

std::vector<int32_t> sample_generate(LlamaModel& model, const std::vector<int32_t>& prompt, int64_t max_new,
                                     const std::vector<int32_t>& stop_ids, const SamplingParams& p, SampleRng& rng) {
  AERIE_CHECK(!prompt.empty(), "sample_generate: empty prompt");
  check_sampling_params(p);
  std::vector<int32_t> out;
  if (max_new <= 0) return out;
  const int64_t n = static_cast<int64_t>(prompt.size());
  KVCache cache = model.make_cache(n + max_new);
  Communicator& tp = model.tp();
  auto pick = [&](Tensor logits) {
    if (logits.device() != Device::CPU) logits = logits.to_device(Device::CPU);
    const int64_t V = logits.dim(1);
    int32_t id = sample_token(logits.data<float>() + (logits.dim(0) - 1) * V, V, p, rng);
    if (tp.size() > 1) {
      Tensor t = Tensor::from_vector(std::vector<int32_t>{id}, {1});
      tp.broadcast(t, 0);
      id = t.data<int32_t>()[0];
    }
    return id;
  };
  if (n > 1) model.forward(std::vector<int32_t>(prompt.begin(), prompt.end() - 1), &cache, {}, false);
  int32_t next = pick(model.forward({prompt.back()}, &cache, {}, true).logits);
  for (int64_t i = 0; i < max_new; ++i) {
    out.push_back(next);
    if (std::find(stop_ids.begin(), stop_ids.end(), next) != stop_ids.end() || i + 1 == max_new) break;
    next = pick(model.forward({next}, &cache, {}, true).logits);
  }
  return out;
}

}  // namespace aerie
