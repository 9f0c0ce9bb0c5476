// Training checkpoints: RUN_DIR/checkpoints/step-%08d/ holding
//   draft.safetensors       F32 master weights, export names (DraftWeights::named())
//   optimizer.safetensors   AdamW moments "m.<name>", "v.<name>" (F32)
//   draft_vocab.safetensors the d2t/t2d file, copied byte for byte (the mapping belongs to the draft and is
//                           never recomputed on resume: SpecForge #534)
//   config.json             {"draft": DraftConfig::to_json(), "train": the training options, "provenance":
//                           the target's, shards' and vocabulary's fingerprints (Checkpoint::provenance)}
//   state.json              TrainState (step, epoch, position, seed, the data split with the held-out list)
//   DONE                    written last
// Protocol (llm.c's): rank 0 writes everything into "step-%08d.tmp", all ranks meet at a barrier, rank 0
// writes DONE, renames the folder to its final name and syncs the parent. A folder without DONE, or with
// the .tmp suffix, is never read. The state is global (weights are replicated over dp), so a run resumes
// on any number of ranks.
#pragma once
#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "comm/communicator.h"
#include "data/vocab.h"
#include "model/draft.h"
#include "train/data_order.h"

namespace aerie {

inline constexpr const char* kCheckpointFormat = "aerie.train_checkpoint";
inline constexpr int64_t kCheckpointFormatVersion = 1;

/// Where training stands; with the checkpoint's weights and moments it fully determines the rest of the run.
struct TrainState {
  int64_t step = 0;             // optimizer updates done (the next update is number step + 1)
  int64_t total_steps = 0;
  int64_t batch_size = 0;       // samples per global step
  int64_t steps_per_epoch = 0;
  int64_t epoch = 0;            // epoch of the next step
  int64_t position = 0;         // index in that epoch's permutation of the next step's first sample
  uint64_t seed = 0;            // epoch e's order: Fisher-Yates with std::mt19937_64(seed + e)
  DataSplit split;              // the sample list and the held-out samples (eval reads them)

  nlohmann::json to_json() const;
  /// Throws aerie::Error on a wrong format name/version or a missing field.
  static TrainState from_json(const nlohmann::json& j);
};

/// The content of one checkpoint.
struct Checkpoint {
  DraftConfig config;
  nlohmann::json train_options;  // as given to the run (the schedule-relevant ones are checked on resume)
  DraftWeights weights;          // F32 master weights
  DraftWeights adam_m, adam_v;   // AdamW first and second moments (F32)
  DraftVocab vocab;              // read from draft_vocab.safetensors (load only)
  TrainState state;
  /// Where the run's inputs came from (config.json "provenance"; null in checkpoints of an older aerie):
  /// {"target": {"model", "config_sha256", "weights_sha256", "num_hidden_layers"}, "shards": {"dir",
  /// "target_config_sha256", "target_weights_sha256", "prepared_sha256", "count", "num_chunks"},
  /// "vocab_sha256"} (io/fingerprint.h). A resumed train and export check them.
  nlohmann::json provenance;
};

/// RUN_DIR/checkpoints/step-%08d.
std::string checkpoint_dir(const std::string& run_dir, int64_t step);

/// Collective over `comm`: rank 0 writes `ck` (config, weights, moments, state; ck.vocab is not used) and a
/// byte copy of `vocab_file` as checkpoint_dir(run_dir, ck.state.step), by the protocol above; the
/// others only join the barriers. A stale .tmp or DONE-less folder of the same step is replaced.
/// Returns the final folder. Throws aerie::Error on I/O failure (naming the file).
std::string save_checkpoint(const std::string& run_dir, const Checkpoint& ck, const std::string& vocab_file,
                            Communicator& comm);

/// The complete checkpoints of RUN_DIR by step, ascending: step -> its step-%08d folder (with DONE).
/// Incomplete folders (no DONE, ".tmp") are skipped; a RUN_DIR without checkpoints/ gives an empty map.
std::map<int64_t, std::string> complete_checkpoints(const std::string& run_dir);

/// The newest complete checkpoint of RUN_DIR (the step-%08d folder with DONE and the largest step), or
/// nullopt if there is none. Incomplete folders (no DONE, ".tmp") are skipped.
std::optional<std::string> latest_checkpoint(const std::string& run_dir);

/// Deletes all but the newest `keep` complete checkpoints of RUN_DIR (keep <= 0: deletes nothing).
/// Incomplete folders are left alone (the next save of their step replaces them). Returns the number deleted.
int remove_old_checkpoints(const std::string& run_dir, int keep);

/// `path` itself if it is a complete checkpoint folder, else the latest checkpoint of `path` taken as
/// a RUN_DIR. Throws aerie::Error if neither holds.
std::string resolve_checkpoint(const std::string& path);

/// Reads a complete checkpoint folder. Throws aerie::Error naming the file on a missing DONE, wrong
/// format/version, a missing tensor or a shape that disagrees with the config. Without `optimizer_state`
/// (export, eval, train --init-draft: the weights alone) optimizer.safetensors is not read, so a checkpoint
/// whose optimizer state was deleted to save space still serves; adam_m / adam_v are then left empty.
Checkpoint load_checkpoint(const std::string& dir, bool optimizer_state = true);

/// Writes `text` to `path` atomically (to `tmp`, "<path>.tmp" when empty, a job's --output:
/// unique_tmp_path(path) of io/output_lock.h; fsync, rename). Throws aerie::Error on failure.
void write_file_atomic(const std::string& path, const std::string& text, const std::string& tmp = "");
/// The whole file as a string. Throws aerie::Error naming the file.
std::string read_file(const std::string& path);

}  // namespace aerie
