// The start of `aerie train` before its first step: the device, the automatic sliding window, a fresh
// start (or warm start from --init-draft) or a resume from the run's newest checkpoint, and the line that
// describes the run.
#pragma once
#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "comm/communicator.h"
#include "core/device.h"
#include "data/vocab.h"
#include "io/fingerprint.h"
#include "model/draft.h"
#include "model/target_config.h"
#include "train/checkpoint.h"
#include "train/data_order.h"
#include "train/schedule.h"
#include "train/shard_set.h"
#include "train/target_head.h"
#include "train/trainer.h"

namespace aerie {

/// The device the draft trains on: opts.device resolved (resolve_train_device), one GPU per rank of dp's
/// node (NCCL refuses two ranks on one GPU): "auto" falls back to the CPU with a warning when the node has
/// more training ranks than GPUs, "cuda" throws aerie::Error. Selects the rank's GPU (local rank) for CUDA.
/// Collective over dp (every rank resolves the same device).
Device choose_train_device(const TrainOptions& opts, Communicator& dp);

/// `--draft-sliding-window auto` (opts.draft_sliding_window_auto; otherwise nothing): sets
/// opts.draft_sliding_window to auto_sliding_window of the training samples' lengths (shards.lengths of the
/// split's training samples), logged on rank 0. Throws aerie::Error for the MLA draft.
void pick_auto_window(TrainOptions& opts, const ShardSet& shards, const TargetConfig& target, int rank);

/// The draft weights of --init-draft (opts.init_draft: a checkpoint folder, or a run folder's newest complete
/// checkpoint, whose folder is returned in `resolved`): its draft config and vocabulary must be this run's (the
/// first difference is named), its weights finite, and opts.output_dir must lie outside it (the warm run would
/// write into the draft it starts from); aerie::Error otherwise. A checkpoint of another target than `model`
/// is taken with a warning.
DraftWeights warm_start_weights(const TrainOptions& opts, const DraftConfig& cfg, const DraftVocab& vocab,
                                const TargetFingerprint& model, int rank, std::string& resolved);

/// Runs `checks` (the checks of a fresh start or resume) on every rank of dp. With `whole_job` (an offline run:
/// dp is every rank of the job) through comm's agree_on_refusal, so a refusal ends the job with status 1 and
/// the message once. In a streaming run the target's ranks wait outside dp for the plan, so the error stays an
/// aerie::Error (main() aborts the job, which releases them).
void refusals_agreed(Communicator& dp, bool whole_job, const std::function<void()>& checks);

/// Where a run starts: its checkpoint (host tensors) and the vocabulary file the next checkpoint copies.
struct RunStart {
  Checkpoint ck;                      // config, weights, moments, vocabulary, state, options, provenance
  std::string vocab_file;             // --vocab, or the resumed checkpoint's draft_vocab.safetensors
  std::optional<std::string> latest;  // the checkpoint resumed from (none: a fresh start)
};

/// A fresh start or a resume from the newest complete checkpoint of opts.output_dir (collective over dp,
/// whose refusals are agreed as refusals_agreed says). A resume loads the checkpoint, adopts the options
/// whose default changed (TrainOptions::adopt_checkpoint_defaults) and checks the options, provenance,
/// shards and aux layers against it; a fresh start loads --vocab and initialises the draft (or takes
/// --init-draft's weights, recording the folder read in opts.init_draft) with zero moments and a new data
/// split. Sets the checkpoint's train options and provenance. Throws aerie::Error naming what differs.
RunStart start_or_resume(TrainOptions& opts, Communicator& dp, bool streamed, const TargetConfig& target,
                         const TargetFingerprint& model_fp, const ShardSet& shards, const TargetHead& head);

/// Rank 0's description of the run at its start (samples, steps, schedule, device, the draft layer, the
/// recipe), and a warning when the batch is smaller than dp.
void log_run_start(const TrainOptions& opts, const DataSplit& split, bool streamed, size_t num_shards, int64_t total,
                   int dp_size, int64_t steps_per_epoch, const LrSchedule& sched, const DraftConfig& cfg, Device dev);

}  // namespace aerie
