// Where a training run's samples come from: the shards of an extraction, read one step ahead on a
// background thread, or the target's ranks of a streaming run (train/stream.h).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "data/shard.h"
#include "train/data_order.h"
#include "train/stream.h"

namespace aerie {

/// True when every element of `t` (F32 or BF16, on the host) is finite.
bool all_finite(const Tensor& t);

/// A training sample's hidden states (F32, or BF16 as shard_source read them, on the host), with the name of its first non-finite dataset
/// ("aux_hidden_states" or "final_hidden_states"; "" when finite).
struct LoadedSample {
  HiddenSample hs;
  std::string nonfinite;
};

/// The hidden states of a run's samples, one instance per dp rank.
class SampleSource {
 public:
  virtual ~SampleSource() = default;
  /// This rank's samples of step `step`: `mine` holds their global sample ids, this rank's share of the
  /// step's batch (BatchOrder::rank_share) in batch order; the result is in the same order. Errors
  /// (aerie::Error) name the shard and sample.
  virtual std::vector<LoadedSample> take(int64_t step, const std::vector<int64_t>& mine) = 0;
  /// Held-out sample `g` (global id), the split's held-out sample number `i` (the position in
  /// DataSplit::eval), F32 on the host.
  virtual HiddenSample heldout_sample(int64_t g, int64_t i) = 0;
  /// Whether the samples are read from shards (the run then logs the time it waited for the reads).
  virtual bool reads_shards() const = 0;
  /// Seconds take() spent waiting for shard reads since the last call (0 for a stream).
  virtual double take_wait_seconds() = 0;
};

/// The samples of `split`'s shards. Training samples are read on a background thread one step ahead: after
/// take(step, ...) the reads of step + 1 (whose share `share_of(step + 1)` gives) start when step + 1 <
/// `total_steps`, so the HDF5 reads and the bf16 / fp8 -> f32 conversion leave the step's critical path;
/// the samples are those read in line (training is bitwise unchanged) at the cost of one more step's
/// samples in host memory. Held-out samples are read on the calling thread. `split` must outlive the source.
/// hidden: the dtype of the samples' hidden states (ShardReader::read: BF16 keeps a bf16 shard's values as
/// stored, half the host memory and device copy of F32). Throws aerie::Error on another dtype.
std::unique_ptr<SampleSource> shard_source(const DataSplit& split,
                                           std::function<std::vector<int64_t>(int64_t)> share_of,
                                           int64_t total_steps, DType hidden = DType::F32);

/// The samples the target's ranks send to this trainer (`stream`, which must outlive the source): the
/// j-th sample of this rank's share has batch position dp_rank + j dp_size.
std::unique_ptr<SampleSource> stream_source(StreamClient& stream, int dp_rank, int dp_size);

}  // namespace aerie
