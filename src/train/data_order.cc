#include "train/data_order.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace aerie {

int64_t DataSplit::num_samples() const {
  int64_t n = 0;
  for (int64_t s : shard_sizes) n += s;
  return n;
}

SampleRef DataSplit::locate(int64_t g) const {
  AERIE_CHECK(g >= 0, "data split: negative sample id " << g);
  int64_t base = 0;
  for (size_t i = 0; i < shard_sizes.size(); ++i) {
    if (g < base + shard_sizes[i]) return SampleRef{static_cast<int64_t>(i), g - base};
    base += shard_sizes[i];
  }
  AERIE_THROW("data split: sample id " << g << " out of range (" << base << " samples)");
}

nlohmann::json DataSplit::to_json() const {
  nlohmann::json j;
  j["format"] = "aerie-data-split";
  j["version"] = 1;
  j["shards"] = nlohmann::json::array();
  for (size_t i = 0; i < shards.size(); ++i)
    j["shards"].push_back({{"path", shards[i]}, {"num_samples", shard_sizes[i]}});
  j["train_count"] = train.size();
  j["eval"] = nlohmann::json::array();
  for (int64_t g : eval) {
    SampleRef r = locate(g);
    j["eval"].push_back({{"global", g}, {"shard", r.shard}, {"index", r.index}});
  }
  return j;
}

DataSplit DataSplit::from_json(const nlohmann::json& j) {
  AERIE_CHECK(j.value("format", "") == "aerie-data-split" && j.value("version", 0) == 1,
              "data split: expected format aerie-data-split version 1, got " << j.value("format", "?") << " "
                                                                              << j.value("version", 0));
  DataSplit s;
  try {
    for (const auto& sh : j.at("shards")) {
      s.shards.push_back(sh.at("path").get<std::string>());
      s.shard_sizes.push_back(sh.at("num_samples").get<int64_t>());
    }
    for (const auto& e : j.at("eval")) s.eval.push_back(e.at("global").get<int64_t>());
  } catch (const nlohmann::json::exception& e) {
    AERIE_THROW("data split: malformed JSON: " << e.what());
  }
  std::vector<char> held(static_cast<size_t>(s.num_samples()), 0);
  for (int64_t g : s.eval) {
    AERIE_CHECK(g >= 0 && g < s.num_samples(), "data split: held-out id " << g << " out of range");
    held[static_cast<size_t>(g)] = 1;
  }
  for (int64_t g = 0; g < s.num_samples(); ++g)
    if (!held[static_cast<size_t>(g)]) s.train.push_back(g);
  AERIE_CHECK(static_cast<int64_t>(s.train.size()) == j.value("train_count", int64_t{-1}),
              "data split: " << s.train.size() << " training samples, the file says " << j.value("train_count", -1));
  return s;
}

DataSplit make_data_split(const std::vector<std::string>& shards, const std::vector<int64_t>& shard_sizes,
                          double eval_fraction) {
  AERIE_CHECK(shards.size() == shard_sizes.size(), "data split: " << shards.size() << " shards, "
                                                                  << shard_sizes.size() << " sizes");
  AERIE_CHECK(eval_fraction >= 0 && eval_fraction < 1, "data split: eval fraction " << eval_fraction
                                                                                    << " not in [0, 1)");
  DataSplit s;
  s.shards = shards;
  s.shard_sizes = shard_sizes;
  const int64_t n = s.num_samples();
  AERIE_CHECK(n > 0, "data split: the shards hold no samples");
  int64_t n_eval = static_cast<int64_t>(std::floor(static_cast<double>(n) * eval_fraction));
  if (eval_fraction > 0 && n_eval == 0 && n >= 2) n_eval = 1;
  n_eval = std::min(n_eval, n - 1);
  for (int64_t g = 0; g < n - n_eval; ++g) s.train.push_back(g);
  for (int64_t g = n - n_eval; g < n; ++g) s.eval.push_back(g);
  return s;
}

uint64_t uniform_below(std::mt19937_64& g, uint64_t n) {
  AERIE_CHECK(n > 0, "uniform_below: empty range");
  // 2^64 mod n: draws below it are rejected so that the rest is a whole number of copies of [0, n).
  const uint64_t threshold = (0 - n) % n;
  for (;;) {
    const uint64_t x = g();
    if (x >= threshold) return x % n;
  }
}

std::vector<int64_t> epoch_permutation(int64_t n, uint64_t seed, int64_t epoch) {
  std::vector<int64_t> a(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) a[static_cast<size_t>(i)] = i;
  std::mt19937_64 g(seed + static_cast<uint64_t>(epoch));
  for (int64_t i = n - 1; i >= 1; --i) {
    const auto j = static_cast<int64_t>(uniform_below(g, static_cast<uint64_t>(i + 1)));
    std::swap(a[static_cast<size_t>(i)], a[static_cast<size_t>(j)]);
  }
  return a;
}

BatchOrder::BatchOrder(const DataSplit& split, int64_t batch_size, uint64_t seed)
    : split_(split), batch_size_(batch_size), seed_(seed) {
  AERIE_CHECK(batch_size >= 1, "batch size must be >= 1, got " << batch_size);
  const auto n_train = static_cast<int64_t>(split.train.size());
  AERIE_CHECK(n_train >= batch_size, "--batch-size " << batch_size << " exceeds the " << n_train
                                                     << " training samples (the samples of " << split.shards.size()
                                                     << " shard(s) or prepared file, e.g. " << (split.shards.empty() ? std::string("?") : split.shards[0])
                                                     << ", less the held-out --eval-fraction)");
  steps_per_epoch_ = n_train / batch_size;
}

std::vector<int64_t> BatchOrder::batch(int64_t step) {
  AERIE_CHECK(step >= 0, "batch order: negative step " << step);
  const int64_t e = epoch_of(step);
  if (e != cached_epoch_) {
    perm_ = epoch_permutation(static_cast<int64_t>(split_.train.size()), seed_, e);
    cached_epoch_ = e;
  }
  const int64_t p = position_of(step);
  std::vector<int64_t> out;
  for (int64_t i = 0; i < batch_size_; ++i) out.push_back(split_.train[static_cast<size_t>(perm_[static_cast<size_t>(p + i)])]);
  return out;
}

std::vector<int64_t> BatchOrder::rank_share(const std::vector<int64_t>& batch, int dp_rank, int dp_size) {
  std::vector<int64_t> out;
  for (size_t i = static_cast<size_t>(dp_rank); i < batch.size(); i += static_cast<size_t>(dp_size)) out.push_back(batch[i]);
  return out;
}

}  // namespace aerie
