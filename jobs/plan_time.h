// aerie plan's time and disk plan from a calibration (jobs/plan_time.cc).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "jobs/jobs.h"
#include "model/target_config.h"
#include "train/time_plan.h"

namespace aerie::jobs {

/// Adds --calibration, --samples, --mean-tokens, --epochs, --world, --storage and --gpu-hour-cost to `desc`.
void add_time_plan_options(po::options_description& desc);

/// The calibration's tensor parallelism when --calibration names a readable calibration.json of aerie calibrate,
/// else 0 (plan's default --tp when none is given: the tp the forward was measured at).
int calibration_tp(const po::variables_map& vm);

/// What --calibration and the dataset options describe, read and checked before anything is printed.
struct TimePlan {
  bool wanted = false;  // --calibration given
  std::string path;     // the calibration.json
  Calibration calibration;
  Workload workload;
  std::string storage;  // extract --storage: bf16 or fp8
  double gpu_hour_cost = 0;
  std::vector<JobTime> jobs;  // plan_time's prediction
};

/// Reads --calibration (nothing without it: wanted false) and the dataset (--prepared, or --samples and
/// --mean-tokens; --epochs, --train-steps, --generate-*, --stream-*) for tensor parallelism `tp` over `world` ranks
/// (--world overrides) and extract's forwards of `batch_tokens` (plan --batch-tokens), and predicts the jobs. Every
/// rank calls it and checks the same inputs. Throws aerie::UsageError naming the option on a missing, unreadable or
/// malformed file, a calibration of another target (hidden size, layers of each kind) or tp than `target` and
/// `tp`, and an option out of range.
TimePlan read_time_plan(const po::variables_map& vm, const TargetConfig& target, int tp, int world,
                        int64_t batch_tokens);

/// Prints the predicted wall time of generate, extract and train (and the streamed train) and the shards' bytes
/// (docs/time-plan.md); nothing when !plan.wanted.
void print_time_plan(const TimePlan& plan);

}  // namespace aerie::jobs
