// Which extraction samples a training step reads: the samples of all shards in a fixed order (shards in
// the order of list_shards, samples in file order), the last eval_fraction of them held out for eval,
// and each epoch a seeded Fisher-Yates permutation of the training samples, cut into global batches.
// The whole order is a function of (split, seed, batch size, step): a checkpoint needs only the step.
#pragma once
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace aerie {

/// A sample's place: shard number (index into DataSplit::shards) and row inside that shard.
struct SampleRef {
  int64_t shard = 0;
  int64_t index = 0;
};

/// The global sample list and its train/eval split. Global sample g counts over the shards in order.
struct DataSplit {
  std::vector<std::string> shards;   // shard paths (absolute), in list_shards order
  std::vector<int64_t> shard_sizes;  // samples per shard
  std::vector<int64_t> train;        // global ids of the training samples, ascending
  std::vector<int64_t> eval;         // global ids of the held-out samples (the last ones), ascending

  int64_t num_samples() const;
  /// Throws aerie::Error if g is out of range.
  SampleRef locate(int64_t g) const;
  /// {"format": "aerie-data-split", "version": 1, "shards": [{"path", "num_samples"}], "train_count",
  /// "eval": [{"global", "shard", "index"}]}: the training ids are the complement of eval.
  nlohmann::json to_json() const;
  /// Inverse of to_json; throws aerie::Error on a wrong format name/version or inconsistent counts.
  static DataSplit from_json(const nlohmann::json& j);
};

/// Holds out the last n_eval = floor(N * eval_fraction) samples (at least 1 when eval_fraction > 0 and
/// N >= 2; never all of them). Throws aerie::Error if there is no sample or eval_fraction is not in [0, 1).
DataSplit make_data_split(const std::vector<std::string>& shards, const std::vector<int64_t>& shard_sizes,
                          double eval_fraction);

/// Uniform integer in [0, n) from 64-bit draws of `g` by rejection (Lemire's threshold), identical on
/// every platform (std::uniform_int_distribution is not). Throws if n == 0.
uint64_t uniform_below(std::mt19937_64& g, uint64_t n);

/// Permutation of 0..n-1 for `epoch`: Fisher-Yates (Durstenfeld: i = n-1 .. 1, swap a[i] with
/// a[uniform_below(i + 1)]) driven by std::mt19937_64 seeded with seed + epoch.
std::vector<int64_t> epoch_permutation(int64_t n, uint64_t seed, int64_t epoch);

/// The global batches: step s reads positions [p, p + B) of epoch e's permutation of the training
/// samples, e = s / steps_per_epoch, p = (s % steps_per_epoch) * B, steps_per_epoch = floor(n_train / B)
/// (the partial batch at the end of an epoch is dropped; the next epoch reshuffles).
class BatchOrder {
 public:
  /// Throws aerie::Error if batch_size < 1 or there are fewer training samples than batch_size.
  BatchOrder(const DataSplit& split, int64_t batch_size, uint64_t seed);
  int64_t steps_per_epoch() const { return steps_per_epoch_; }
  int64_t epoch_of(int64_t step) const { return step / steps_per_epoch_; }
  int64_t position_of(int64_t step) const { return (step % steps_per_epoch_) * batch_size_; }
  /// Global sample ids of step `step`'s batch (B of them), in batch order.
  std::vector<int64_t> batch(int64_t step);
  /// This dp rank's share: batch entries r, r + dp, r + 2 dp, ...
  static std::vector<int64_t> rank_share(const std::vector<int64_t>& batch, int dp_rank, int dp_size);

 private:
  const DataSplit& split_;
  int64_t batch_size_;
  uint64_t seed_;
  int64_t steps_per_epoch_;
  int64_t cached_epoch_ = -1;
  std::vector<int64_t> perm_;
};

}  // namespace aerie
