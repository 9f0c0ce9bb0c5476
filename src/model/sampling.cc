#include "model/sampling.h"

#include <algorithm>
#include <cmath>
#include <exception>
#include <numeric>
#include <thread>

#include "core/error.h"
#include "kernels/loss.h"
#include "model/target.h"

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
    // Smallest prefix, in order of decreasing probability (ties by id: a total order), whose mass reaches
    // top_p (the token that crosses it is kept). Only the first k ids are sorted (partial_sort, k grown
    // 8x until the prefix is inside them): the same prefix and the same sums as a full sort, for O(V log k).
    auto by_prob = [&](int32_t a, int32_t b) { return e[a] != e[b] ? e[a] > e[b] : a < b; };
    size_t keep = 0;
    for (size_t k = std::min<size_t>(ids.size(), 256);; k = std::min(ids.size(), 8 * k)) {
      std::partial_sort(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(k), ids.end(), by_prob);
      double mass = 0;
      keep = 0;
      bool reached = false;
      while (keep < k) {
        mass += e[ids[keep++]] / sum;
        if (mass >= p.top_p) {
          reached = true;
          break;
        }
      }
      if (reached || k == ids.size()) break;
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

// ------------------------------------------------------------------------------------------ batch decoding

struct BatchDecoder::Sequence {
  int64_t key = 0;
  std::vector<int32_t> feed;  // the rows of the next forward: the prompt, then the last drawn token
  int64_t max_new = 0;
  SampleRng rng{0};
  std::unique_ptr<KVCache> cache;  // allocated when the sequence starts
  std::vector<int32_t> out;
};

BatchDecoder::BatchDecoder(TargetModel& model, int64_t batch_size, std::vector<int32_t> stop_ids,
                           const SamplingParams& p, int64_t max_step_rows)
    : model_(model), batch_size_(batch_size), max_step_rows_(max_step_rows), stop_ids_(std::move(stop_ids)),
      params_(p) {
  AERIE_CHECK(batch_size >= 1, "BatchDecoder: batch size must be >= 1, got " << batch_size);
  AERIE_CHECK(max_step_rows >= 1, "BatchDecoder: max_step_rows must be >= 1, got " << max_step_rows);
  check_sampling_params(p);
  std::sort(stop_ids_.begin(), stop_ids_.end());
}

BatchDecoder::~BatchDecoder() = default;

void BatchDecoder::submit(int64_t key, std::vector<int32_t> prompt, int64_t max_new, const SampleRng& rng) {
  AERIE_CHECK(!prompt.empty(), "BatchDecoder::submit: sequence " << key << " has an empty prompt");
  AERIE_CHECK(max_new >= 1, "BatchDecoder::submit: sequence " << key << ": max_new must be >= 1, got " << max_new);
  auto s = std::make_unique<Sequence>();
  s->key = key;
  s->feed = std::move(prompt);
  s->max_new = max_new;
  s->rng = rng;
  queue_.push_back(std::move(s));
}

bool BatchDecoder::idle() const { return running_.empty() && queue_.empty(); }
int64_t BatchDecoder::running() const { return static_cast<int64_t>(running_.size()); }
int64_t BatchDecoder::queued() const { return static_cast<int64_t>(queue_.size()); }

std::vector<BatchDecoder::Finished> BatchDecoder::step() {
  int64_t step_rows = static_cast<int64_t>(running_.size());  // one row per running sequence
  while (static_cast<int64_t>(running_.size()) < batch_size_ && !queue_.empty()) {
    const int64_t n = static_cast<int64_t>(queue_.front()->feed.size());
    if (!running_.empty() && step_rows + n > max_step_rows_) break;  // starts at a later step
    step_rows += n;
    std::unique_ptr<Sequence> s = std::move(queue_.front());
    queue_.pop_front();
    s->cache = std::make_unique<KVCache>(model_.make_cache(static_cast<int64_t>(s->feed.size()) + s->max_new));
    running_.push_back(std::move(s));
  }
  std::vector<Finished> done;
  if (running_.empty()) return done;
  const int64_t B = static_cast<int64_t>(running_.size());
  std::vector<std::vector<int32_t>> ids;
  std::vector<KVCache*> caches;
  for (const auto& s : running_) {
    ids.push_back(s->feed);
    caches.push_back(s->cache.get());
    rows_ += static_cast<int64_t>(s->feed.size());
  }
  Tensor logits = model_.forward_batch(ids, caches, {}, TargetModel::Logits::Last).logits;  // [B, V] F32
  AERIE_CHECK(logits.dim(0) == B, "BatchDecoder: forward_batch returned " << logits.dim(0) << " logits rows for "
                                                                          << B << " sequences");
  std::vector<int32_t> next(static_cast<size_t>(B));
  if (params_.temperature == 0 && logits.device() != Device::CPU) {
    // Greedy on a device: argmax_rows there (ties: the smaller id, as sample_token); B ids come back.
    std::vector<int64_t> best = argmax_rows(logits);
    for (int64_t b = 0; b < B; ++b) next[b] = static_cast<int32_t>(best[b]);
  } else {
    const bool from_device = logits.device() != Device::CPU;
    if (from_device) logits = logits.to_device(Device::CPU);
    const int64_t V = logits.dim(1);
    const float* rows = logits.data<float>();
    auto draw = [&](int64_t b0, int64_t b1) {
      for (int64_t b = b0; b < b1; ++b) next[b] = sample_token(rows + b * V, V, params_, running_[b]->rng);
    };
    // Beside a GPU the host's draws (softmax and top-p over V per sequence) would dominate a step: up to 8
    // threads, each drawing for its own sequences with their own rngs (the same tokens as one thread).
    const int64_t threads = from_device ? std::min<int64_t>({B, 8, std::max(1u, std::thread::hardware_concurrency())}) : 1;
    if (threads <= 1) {
      draw(0, B);
    } else {
      std::vector<std::thread> pool;
      std::vector<std::exception_ptr> errors(static_cast<size_t>(threads));
      for (int64_t t = 0; t < threads; ++t)
        pool.emplace_back([&, t] {
          try {
            draw(B * t / threads, B * (t + 1) / threads);
          } catch (...) {
            errors[t] = std::current_exception();
          }
        });
      for (std::thread& th : pool) th.join();
      for (const std::exception_ptr& e : errors)
        if (e) std::rethrow_exception(e);
    }
  }
  Communicator& tp = model_.tp();
  if (tp.size() > 1) {  // tp rank 0's draws for everyone
    Tensor t = Tensor::from_vector(next, {B});
    if (model_.device() != Device::CPU) t = t.to_device(model_.device());  // a device communicator (NCCL)
    tp.broadcast(t, 0);
    if (t.device() != Device::CPU) t = t.to_device(Device::CPU);
    std::copy(t.data<int32_t>(), t.data<int32_t>() + B, next.begin());
  }
  std::vector<std::unique_ptr<Sequence>> still;
  for (int64_t b = 0; b < B; ++b) {
    std::unique_ptr<Sequence>& s = running_[b];
    s->out.push_back(next[b]);
    const bool stop = std::binary_search(stop_ids_.begin(), stop_ids_.end(), next[b]);
    if (stop || static_cast<int64_t>(s->out.size()) >= s->max_new) {
      done.push_back({s->key, std::move(s->out), s->rng});
    } else {
      s->feed.assign(1, next[b]);
      still.push_back(std::move(s));
    }
  }
  running_ = std::move(still);
  return done;
}

std::vector<int32_t> sample_generate(TargetModel& model, const std::vector<int32_t>& prompt, int64_t max_new,
                                     const std::vector<int32_t>& stop_ids, const SamplingParams& p, SampleRng& rng) {
  AERIE_CHECK(!prompt.empty(), "sample_generate: empty prompt");
  check_sampling_params(p);
  if (max_new <= 0) return {};
  BatchDecoder dec(model, 1, stop_ids, p);
  dec.submit(0, prompt, max_new, rng);
  for (;;) {
    std::vector<BatchDecoder::Finished> f = dec.step();
    if (!f.empty()) {
      rng = f[0].rng;
      return std::move(f[0].ids);
    }
  }
}

}  // namespace aerie
