// The run folder of `aerie train`: lock, data split, JSON-lines logs and event files (run_folder.h).
#include "train/run_folder.h"

#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "core/log.h"
#include "train/checkpoint.h"

namespace aerie {

namespace fs = std::filesystem;

void truncate_metrics(const std::string& path, int64_t step) {
  if (!fs::exists(path)) return;
  std::ifstream in(path);
  std::string line, kept;
  while (std::getline(in, line)) {
    try {
      if (nlohmann::json::parse(line).value("step", int64_t{0}) <= step) kept += line + "\n";
    } catch (const nlohmann::json::exception&) {
      // a torn last line of a killed run
    }
  }
  write_file_atomic(path, kept);
}

// The TensorBoard scalars of one log interval (docs/formats.md, TensorBoard event files).
std::vector<std::pair<std::string, double>> interval_scalars(const StepMetrics& m, double lr, double tokens_per_s) {
  std::vector<std::pair<std::string, double>> s = {{"train/loss", m.loss()},
                                                   {"train/tau_sim", m.tau_sim()},
                                                   {"train/lr", lr},
                                                   {"train/grad_norm", m.grad_norm},
                                                   {"train/tokens_per_s", tokens_per_s}};
  const std::vector<double> loss_k = m.loss_k(), acc_k = m.acc_k();
  for (size_t k = 0; k < loss_k.size(); ++k) s.emplace_back("train/loss_k/" + std::to_string(k), loss_k[k]);
  for (size_t k = 0; k < acc_k.size(); ++k) s.emplace_back("train/acc_k/" + std::to_string(k), acc_k[k]);
  return s;
}

RunFolder::RunFolder(const std::string& dir, Communicator& dp) : dir_(dir), rank_(dp.rank()) {
  // Stale .tmp files are replaced only under the lock.
  if (rank_ == 0) {
    fs::create_directories(dir_);
    if (!OutputLock::held_here(dir_, LockTarget::Folder))
      lock_ = OutputLock::acquire(dir_, LockTarget::Folder, "train");
  }
  dp.barrier();
}

void RunFolder::start(const DataSplit& split, bool resumed, int64_t step) {
  if (rank_ != 0) return;
  write_file_atomic(dir_ + "/data_split.json", split.to_json().dump(1) + "\n");
  if (!resumed) return;
  truncate_metrics(metrics_path(), step);
  truncate_metrics(heldout_path(), step);
  const int64_t dropped = truncate_event_files(dir_, step);
  if (dropped > 0)
    AERIE_LOG(info) << "train: dropped " << dropped << " TensorBoard event(s) past step " << step
                    << " from the event files of the killed run";
}

void RunFolder::open_events() {
  if (rank_ != 0) return;
  if (event_files_supported()) {
    events_ = std::make_unique<EventFileWriter>(dir_);
    AERIE_LOG(info) << "train: TensorBoard events in " << events_->path() << " (tensorboard --logdir " << dir_ << ")";
  } else {
    AERIE_LOG(info) << "train: " << event_files_unsupported_reason() << "; the curves are in " << metrics_path();
  }
}

void RunFolder::append_metrics(const nlohmann::json& line, int64_t step, const Scalars& scalars) {
  append(metrics_path(), line, step, scalars);
}

void RunFolder::append_heldout(const nlohmann::json& line, int64_t step, const Scalars& scalars) {
  append(heldout_path(), line, step, scalars);
}

void RunFolder::append(const std::string& path, const nlohmann::json& line, int64_t step, const Scalars& scalars) {
  if (rank_ != 0) return;
  {
    std::ofstream out(path, std::ios::app);
    out << line.dump() << "\n";
    AERIE_CHECK(out.good(), "train: cannot append to " << path);
  }
  if (events_) events_->add_scalars(step, scalars);
}

}  // namespace aerie
