// The run folder of `aerie train` as rank 0 writes it: its lock, data_split.json, metrics.jsonl,
// heldout.jsonl and the TensorBoard event files (docs/formats.md, Training logs).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "comm/communicator.h"
#include "io/event_file.h"
#include "io/output_lock.h"
#include "train/data_order.h"
#include "train/trainer.h"

namespace aerie {

/// TensorBoard scalars: (tag, value) pairs.
using Scalars = std::vector<std::pair<std::string, double>>;

/// The TensorBoard scalars of one log interval (train/loss, train/tau_sim, train/lr, train/grad_norm,
/// train/tokens_per_s, train/loss_k/k, train/acc_k/k), from the interval's metrics `m`, the lr of its
/// last step and its throughput in tokens per second.
Scalars interval_scalars(const StepMetrics& m, double lr, double tokens_per_s);

/// Keeps the lines of a JSON-lines log (metrics.jsonl, heldout.jsonl) of steps <= `step` (a killed run may
/// have logged past its last checkpoint); a torn line is dropped. No file: nothing to do. Throws
/// aerie::Error when the file cannot be rewritten.
void truncate_metrics(const std::string& path, int64_t step);

/// A run folder, collective over dp on construction: rank 0 creates it and holds its lock
/// (OUTPUT/.aerie.lock, io/output_lock.h) unless this process holds it already (jobs/train.cc takes it
/// before the target loads), then every rank waits for it (barrier). Throws aerie::Error naming the holder
/// when another job has the lock. The writes below are rank 0's; on other ranks they do nothing.
class RunFolder {
 public:
  RunFolder(const std::string& dir, Communicator& dp);
  const std::string& dir() const { return dir_; }
  std::string metrics_path() const { return dir_ + "/metrics.jsonl"; }
  std::string heldout_path() const { return dir_ + "/heldout.jsonl"; }

  /// Writes data_split.json (the held-out samples eval uses) and, for a resumed run, drops what a killed
  /// run logged past `step` (the checkpoint's) from metrics.jsonl, heldout.jsonl and the event files.
  void start(const DataSplit& split, bool resumed, int64_t step);
  /// Starts a new TensorBoard event file of this run or resume (logged), or logs why this build has none.
  void open_events();
  /// Appends `line` to metrics.jsonl and `scalars` at `step` to the event file. Throws aerie::Error when
  /// the line cannot be appended.
  void append_metrics(const nlohmann::json& line, int64_t step, const Scalars& scalars);
  /// Appends `line` to heldout.jsonl and `scalars` at `step` to the event file (as append_metrics).
  void append_heldout(const nlohmann::json& line, int64_t step, const Scalars& scalars);

 private:
  void append(const std::string& path, const nlohmann::json& line, int64_t step, const Scalars& scalars);
  std::string dir_;
  int rank_;
  OutputLock lock_;
  std::unique_ptr<EventFileWriter> events_;
};

}  // namespace aerie
