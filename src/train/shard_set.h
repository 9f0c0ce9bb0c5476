// The training samples' origin as `aerie train` checks it: the shard folder of one extraction (or, when
// streaming, the prepared file the target's ranks read), its provenance against --model, and on resume
// against what the checkpoint recorded.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "data/shard.h"
#include "io/fingerprint.h"
#include "model/target_config.h"
#include "train/data_order.h"
#include "train/stream.h"
#include "train/trainer.h"

namespace aerie {

/// The shards of a folder with their sample counts, and what they agree on (streaming: the prepared file
/// as one "shard" of N samples, streamed_set).
struct ShardSet {
  std::vector<std::string> paths;
  std::vector<int64_t> sizes;
  std::vector<int64_t> lengths;  // every sample's token count, by global sample id (--draft-sliding-window auto)
  std::vector<int> aux_layers;
  int64_t hidden_size = 0, num_hidden_layers = 0;
  ShardInfo provenance;      // of the first shard that records it (has_provenance() false: none does)
  std::string target_model;  // the --model path extract recorded (first shard)
  int64_t unrecorded = 0;    // shards of an older aerie, without provenance
  std::string target_gemm;   // ShardInfo::target_gemm, one for all ("w8a8-fp8-block ..." or "")
};

/// Reads every shard's attributes of `dir` and checks that the folder is one complete extraction of a
/// target of `target`'s hidden size and layer count: the same aux layers, hidden size, target precision
/// and provenance everywhere, and no chunk missing unless opts.allow_missing_shards (then a warning). The
/// shards are those the folder's files record (read_shard_folder): other .h5 files are skipped with a
/// warning naming each. Logs on rank 0. Throws aerie::Error naming the shards that disagree.
ShardSet scan_shards(const std::string& dir, const TargetConfig& target, const TrainOptions& opts, int rank);

/// The shards' target against --model (`model`): throws aerie::Error naming the difference unless
/// opts.allow_other_target (then a warning on rank 0). Shards of extract --random-weights are compared by
/// config.json only; shards without provenance are not compared.
void check_shards_target(const ShardSet& s, const TargetFingerprint& model, const TrainOptions& opts, int rank);

/// Streaming (train/stream.h): the prepared file in the place of the shards: one "shard" of N samples
/// (global sample g = prepared sample g), the stream's aux layers, and the provenance of the target
/// (`model`, `model_dir`: --target-model) and the prepared file that the shards of an extraction would record.
ShardSet streamed_set(const StreamClient& stream, const TargetConfig& target, const TargetFingerprint& model,
                      const std::string& model_dir, const std::string& target_gemm);

/// The run's inputs as recorded in its checkpoints (Checkpoint::provenance): the target (--model, absolute,
/// and its fingerprint), the shards (folder, count, their provenance) and the draft vocabulary's sha256 of
/// `vocab_file` (read here; throws aerie::Error when it cannot be read).
nlohmann::json make_provenance(const TrainOptions& opts, const TargetFingerprint& model, const TargetConfig& target,
                               const ShardSet& s, const std::string& vocab_file);

/// The target fingerprint a checkpoint's provenance records (empty digests when it records none).
TargetFingerprint recorded_target(const nlohmann::json& provenance);

/// A resumed run's --model and --shards (or streamed prepared file) against its checkpoint's provenance
/// `was` (null: an older aerie, a warning on rank 0). Throws aerie::Error naming what differs (another
/// target unless opts.allow_other_target, another target precision, other shards or prepared file).
void check_resume_provenance(const nlohmann::json& was, const std::string& checkpoint, const TrainOptions& opts,
                             const TargetFingerprint& model, const ShardSet& s, int rank);

/// The shards must be the ones the checkpoint was trained on (names and sample counts; the folder may move).
/// Streaming: the prepared file may also be renamed (its fingerprint is checked by the provenance). Throws
/// aerie::Error naming the first shard that differs.
void check_same_shards(const ShardSet& now, const DataSplit& was, bool streamed);

}  // namespace aerie
