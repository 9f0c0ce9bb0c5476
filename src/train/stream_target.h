// The target side of a streaming `aerie train` (train/stream.h): the prepared file's checks before the
// target loads, and the target model serving the trainers' steps.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "model/target.h"
#include "model/target_config.h"
#include "train/stream.h"

namespace aerie {

/// What the target's ranks of a streaming run compute: the samples of `prepared_path` through the target
/// in `target_model` (`train --target-model`), its aux layers (3 ids; `aux_layers_default`: the default 2,
/// N/2, N-3, not given), and up to `batch_tokens` tokens per forward on a GPU (0: one sample per forward).
struct StreamTargetJob {
  std::string prepared_path, target_model;
  std::vector<int> aux_layers;
  bool aux_layers_default = false;
  int64_t batch_tokens = 0;
  int64_t batch_size = 1;  // samples per step, over all target replicas (--batch-size)
};

/// The checks of the prepared file before the target loads (every target rank): every sample within the
/// target's max_position_embeddings (`tcfg`), and with `first` (world rank 0) every token id within its
/// vocabulary (a bad id would otherwise stop the run only when its sample comes) and a warning when the aux
/// layers name one layer twice. Throws aerie::Error naming the sample and the file.
void check_stream_prepared(const StreamTargetJob& job, const TargetConfig& tcfg, bool first);

/// Serves the trainers (run_stream_target) with `model`, loaded on every target rank with `options`
/// (device, dtype) over the replica's tensor-parallel group `tp` (host MPI): each step's hidden states of
/// the aux layers and the final layer, batched on a GPU up to job.batch_tokens tokens. World rank 0 logs
/// the layout. Returns this replica's counts (StreamTargetStats::stop_signal: the trainers were stopped).
/// Throws aerie::Error on a bad message or input (the job then aborts).
StreamTargetStats serve_stream_target(MpiCommunicator& world, const StreamLayout& layout, MpiCommunicator& tp,
                                      TargetModel& model, const TargetModelOptions& options,
                                      const TargetConfig& tcfg, const StreamTargetJob& job);

}  // namespace aerie
