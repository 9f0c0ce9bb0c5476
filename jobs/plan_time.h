// aerie plan's time and disk plan from a calibration (jobs/plan_time.cc).
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "jobs/jobs.h"
#include "model/target_config.h"
#include "train/time_plan.h"

namespace aerie::jobs {

/// What of `t` a calibration's times depend on beyond its hidden size and layers of each kind (which plan checks
/// apart): vocabulary, MLP and expert widths, heads, the MLA ranks, experts and top-k, the weight format, as one
/// line ("vocab 163840, intermediate 18432, heads 64 / kv 64 x 128, mla 1536 / 512, experts 384 top 8 x 2048 (+1
/// shared), INT4 (compressed-tensors pack-quantized)"). calibrate records it (Calibration::target); plan refuses a calibration whose line differs.
std::string calibration_target(const TargetConfig& t);

/// Adds --calibration, --samples, --mean-tokens, --epochs, --world, --storage and --gpu-hour-cost to `desc`.
void add_time_plan_options(po::options_description& desc);

/// --calibration's calibration.json of aerie calibrate, or nullopt without --calibration. Throws aerie::UsageError
/// naming the option on an empty path and on a missing, unreadable or malformed file.
std::optional<Calibration> read_calibration_option(const po::variables_map& vm);

/// What --calibration and the dataset options describe, read and checked before anything is printed.
struct TimePlan {
  bool wanted = false;  // a calibration was given (TimePlan{}: none, nothing printed)
  std::string path;     // the calibration.json
  Calibration calibration;
  Workload workload;
  std::string storage;  // extract --storage: bf16 or fp8
  double gpu_hour_cost = 0;
  int64_t max_position = 0;   // the target's max_position_embeddings (0: none): calibrate's --tokens stop there
  std::string packing_note;   // a --tp-overlap calibration's forwards that the jobs will not split (else empty)
  std::string layout_note;    // the calibration's expert split is not the plan's (else empty)
  std::string generate_note;  // --batch-size is not the batch the calibration's generate decoded (else empty)
  std::vector<JobTime> jobs;  // plan_time's prediction
};

/// The plan of `calibration` (read_calibration_option's) for the dataset (--prepared, or --samples and
/// --mean-tokens; --epochs, --train-steps, --generate-*, --stream-*) at tensor parallelism `tp` over `world` ranks
/// (--world overrides) and extract's forwards of `batch_tokens` (plan --batch-tokens), with plan_time's prediction.
/// Every rank calls it and checks the same inputs. Throws aerie::UsageError naming the option on a calibration of
/// another target (hidden size, layers of each kind) or tp than `target` and `tp`, a missing or malformed
/// --prepared, and an option out of range.
TimePlan read_time_plan(const po::variables_map& vm, const Calibration& calibration, const TargetConfig& target, int tp,
                        int world, int64_t batch_tokens);

/// Prints the predicted wall time of generate, extract and train (and the streamed train) and the shards' bytes
/// (docs/time-plan.md); nothing when !plan.wanted.
void print_time_plan(const TimePlan& plan);

}  // namespace aerie::jobs
