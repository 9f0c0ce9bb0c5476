// aerie plan's time and disk plan from a calibration (jobs/plan_time.cc).
#pragma once
#include <cstdint>

#include "jobs/jobs.h"
#include "model/target_config.h"

namespace aerie::jobs {

/// Adds --calibration, --samples, --mean-tokens, --epochs, --world, --storage and --gpu-hour-cost to `desc`.
void add_time_plan_options(po::options_description& desc);

/// With --calibration: prints (when `print`; every rank calls it and checks the same inputs) the predicted wall time of extract and train and the shards' bytes
/// for the dataset of --samples x --mean-tokens at tensor parallelism `tp` over `world` ranks (--world overrides),
/// extract's forwards of `batch_tokens` (plan --batch-tokens). Nothing without --calibration. Throws
/// aerie::UsageError naming the option on a missing or unreadable file or dataset, aerie::Error naming the file on
/// a malformed calibration or one measured at another tp; aerie::UsageError when the calibration is of a target of
/// another hidden size or layer count than `target` (plan's --model).
void print_time_plan(const po::variables_map& vm, const TargetConfig& target, int tp, int world, int64_t batch_tokens,
                     bool print);

}  // namespace aerie::jobs
