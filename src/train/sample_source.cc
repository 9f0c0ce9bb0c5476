// The samples of a training run: shards read one step ahead, or the target's ranks' stream (sample_source.h).
#include "train/sample_source.h"

#include <chrono>
#include <cmath>
#include <future>
#include <map>
#include <mutex>

#include "core/bf16.h"
#include "data/shard_pipeline.h"

namespace aerie {

bool all_finite(const Tensor& t) {
  if (t.dtype() == DType::BF16) {  // an exponent of all ones: an infinity or a NaN
    const bf16* p = t.data<bf16>();
    for (int64_t i = 0, n = t.numel(); i < n; ++i)
      if ((p[i].bits & 0x7f80u) == 0x7f80u) return false;
    return true;
  }
  const float* p = t.data<float>();
  for (int64_t i = 0, n = t.numel(); i < n; ++i)
    if (!std::isfinite(p[i])) return false;
  return true;
}


namespace {

// Open shard readers of one thread, at most kMaxOpen (samples come from random shards; a large run has
// thousands of files): the least recently used one is closed first. Not thread-safe: each instance
// belongs to one thread. Its HDF5 calls (opening, reading, closing) hold hdf5_mutex(), so two instances
// may be used by two threads (HDF5 as Debian builds it is not thread-safe).
class ShardReaders {
 public:
  ShardReaders(const DataSplit& split, DType hidden) : split_(split), hidden_(hidden) {}
  ~ShardReaders() {
    std::lock_guard<std::mutex> h5(hdf5_mutex());
    open_.clear();
  }
  ShardReaders(const ShardReaders&) = delete;
  ShardReaders& operator=(const ShardReaders&) = delete;

  /// Global sample g of the split, hidden states in the reader's dtype (ShardReader::read; its errors name the
  /// shard).
  HiddenSample read(int64_t g) {
    const SampleRef ref = split_.locate(g);
    std::lock_guard<std::mutex> h5(hdf5_mutex());
    auto it = open_.find(ref.shard);
    if (it == open_.end()) {
      if (open_.size() >= kMaxOpen) {
        auto lru = open_.begin();
        for (auto j = open_.begin(); j != open_.end(); ++j)
          if (j->second.second < lru->second.second) lru = j;
        open_.erase(lru);
      }
      auto r = std::make_unique<ShardReader>(split_.shards[static_cast<size_t>(ref.shard)]);
      it = open_.emplace(ref.shard, std::make_pair(std::move(r), int64_t{0})).first;
    }
    it->second.second = ++uses_;
    return it->second.first->read(ref.index, hidden_);
  }

 private:
  static constexpr size_t kMaxOpen = 32;
  const DataSplit& split_;
  DType hidden_;
  std::map<int64_t, std::pair<std::unique_ptr<ShardReader>, int64_t>> open_;  // shard -> (reader, last use)
  int64_t uses_ = 0;
};

// A sample read from the shards, with the name of its first non-finite dataset ("" when finite).

// (on a GPU they leave it idle; the fp8 shards' dequantization made a SmolLM2 run 1.3x longer,
// docs/performance.md). The samples are the same as read in line, so training is bitwise unchanged; the
// cost is host memory for one more step's samples (F32 [T, 4H] each). A read error surfaces when the
// step that needs the sample takes it, naming the shard and the sample as before.
class StepPrefetcher {
 public:
  StepPrefetcher(const DataSplit& split, DType hidden) : readers_(split, hidden) {}
  ~StepPrefetcher() {
    if (next_.valid()) next_.wait();  // the task uses readers_
  }

  /// Starts reading the global samples `g` of step `step` (one read ahead at a time).
  void start(int64_t step, std::vector<int64_t> g) {
    if (next_.valid()) next_.wait();
    next_step_ = step;
    next_ = std::async(std::launch::async, [this, g = std::move(g)] { return load(g); });
  }
  /// The samples `g` of step `step`: those started for it (waiting for them), else read now.
  std::vector<LoadedSample> take(int64_t step, const std::vector<int64_t>& g) {
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<LoadedSample> out;
    if (next_.valid() && next_step_ == step) {
      out = next_.get();
    } else {
      if (next_.valid()) next_.wait();
      out = load(g);
    }
    wait_s_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return out;
  }
  /// Seconds the caller spent in take() (waiting for reads), summed; reset by the caller's reads of it.
  double take_wait_seconds() {
    const double s = wait_s_;
    wait_s_ = 0;
    return s;
  }

 private:
  std::vector<LoadedSample> load(const std::vector<int64_t>& g) {
    std::vector<LoadedSample> out(g.size());
    for (size_t j = 0; j < g.size(); ++j) {
      out[j].hs = readers_.read(g[j]);
      out[j].nonfinite = !all_finite(out[j].hs.aux_hidden)     ? "aux_hidden_states"
                         : !all_finite(out[j].hs.final_hidden) ? "final_hidden_states"
                                                               : "";
    }
    return out;
  }
  ShardReaders readers_;  // used by the task only (and by take() when nothing was started)
  std::future<std::vector<LoadedSample>> next_;
  int64_t next_step_ = -1;
  double wait_s_ = 0;
};

class ShardSource final : public SampleSource {
 public:
  ShardSource(const DataSplit& split, std::function<std::vector<int64_t>(int64_t)> share_of, int64_t total_steps,
              DType hidden)
      : heldout_readers_(split, hidden), prefetch_(split, hidden), share_of_(std::move(share_of)), total_steps_(total_steps) {}
  std::vector<LoadedSample> take(int64_t step, const std::vector<int64_t>& mine) override {
    std::vector<LoadedSample> loaded = prefetch_.take(step, mine);
    if (step + 1 < total_steps_) prefetch_.start(step + 1, share_of_(step + 1));
    return loaded;
  }
  HiddenSample heldout_sample(int64_t g, int64_t /*i*/) override { return heldout_readers_.read(g); }
  bool reads_shards() const override { return true; }
  double take_wait_seconds() override { return prefetch_.take_wait_seconds(); }

 private:
  ShardReaders heldout_readers_;  // the held-out scoring's (this thread)
  StepPrefetcher prefetch_;       // the training steps' (read one step ahead)
  std::function<std::vector<int64_t>(int64_t)> share_of_;
  int64_t total_steps_;
};

class StreamSource final : public SampleSource {
 public:
  StreamSource(StreamClient& stream, int dp_rank, int dp_size) : stream_(stream), rank_(dp_rank), size_(dp_size) {}
  std::vector<LoadedSample> take(int64_t /*step*/, const std::vector<int64_t>& mine) override {
    std::vector<LoadedSample> out(mine.size());
    for (size_t j = 0; j < mine.size(); ++j) {
      // Batch position of mine[j]: rank_share gives this rank positions rank, rank + dp, ...
      out[j].hs = stream_.train_sample(mine[j], rank_ + static_cast<int64_t>(j) * size_);
      out[j].nonfinite = !all_finite(out[j].hs.aux_hidden)     ? "aux_hidden_states"
                         : !all_finite(out[j].hs.final_hidden) ? "final_hidden_states"
                                                               : "";
    }
    return out;
  }
  HiddenSample heldout_sample(int64_t g, int64_t i) override { return stream_.heldout_sample(g, i); }
  bool reads_shards() const override { return false; }
  double take_wait_seconds() override { return 0.0; }

 private:
  StreamClient& stream_;
  int rank_, size_;
};

}  // namespace

std::unique_ptr<SampleSource> shard_source(const DataSplit& split,
                                           std::function<std::vector<int64_t>(int64_t)> share_of,
                                           int64_t total_steps, DType hidden) {
  return std::make_unique<ShardSource>(split, std::move(share_of), total_steps, hidden);
}

std::unique_ptr<SampleSource> stream_source(StreamClient& stream, int dp_rank, int dp_size) {
  return std::make_unique<StreamSource>(stream, dp_rank, dp_size);
}

}  // namespace aerie
