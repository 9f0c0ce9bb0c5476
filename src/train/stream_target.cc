// The target side of a streaming `aerie train` (stream_target.h).
#include "train/stream_target.h"

#include <algorithm>

#include "core/log.h"
#include "data/extract.h"

namespace aerie {

void check_stream_prepared(const StreamTargetJob& job, const TargetConfig& tcfg, bool first) {
  const PreparedFile prepared(job.prepared_path);
  if (tcfg.max_position_embeddings > 0) {  // as extract: no positions the model was not made for
    const auto& off = prepared.sample_offsets();
    for (size_t i = 0; i + 1 < off.size(); ++i)
      AERIE_CHECK(off[i + 1] - off[i] <= tcfg.max_position_embeddings,
                  "train: sample " << i << " of " << job.prepared_path << " has " << off[i + 1] - off[i]
                                   << " tokens, past the target's max_position_embeddings "
                                   << tcfg.max_position_embeddings << " (" << job.target_model
                                   << "/config.json): prepare again with --max-length "
                                   << tcfg.max_position_embeddings);
  }
  if (!first) return;
  // Every id in the target's vocabulary, before the model loads (a bad id would otherwise stop the run
  // only when its sample comes, perhaps before the first checkpoint: each rerun would repeat the steps).
  constexpr int64_t kChunk = 4096;
  std::vector<int32_t> ids;
  std::vector<uint8_t> mask;
  for (int64_t b = 0; b < prepared.num_samples(); b += kChunk) {
    const int64_t e = std::min(prepared.num_samples(), b + kChunk);
    prepared.read_tokens(b, e, ids, mask);
    for (size_t t = 0; t < ids.size(); ++t) {
      if (ids[t] >= 0 && ids[t] < tcfg.vocab_size) continue;
      const auto& off = prepared.sample_offsets();
      const int64_t at = off[static_cast<size_t>(b)] + static_cast<int64_t>(t);
      const int64_t g = std::upper_bound(off.begin(), off.end(), at) - off.begin() - 1;
      AERIE_THROW("train: prepared sample " << g << " of " << job.prepared_path << " has id " << ids[t]
                                            << " at position " << at - off[static_cast<size_t>(g)]
                                            << ", outside the target's vocabulary [0, " << tcfg.vocab_size
                                            << ") of " << job.target_model << " (prepared with another tokenizer?)");
    }
  }
  const std::vector<int>& aux = job.aux_layers;
  if (aux[0] == aux[1] || aux[1] == aux[2])
    AERIE_LOG(warning) << "train: aux layers " << aux[0] << "," << aux[1] << "," << aux[2]
                       << " name one layer more than once"
                       << (job.aux_layers_default ? " (the default 2, N/2, N-3 of a " +
                                                        std::to_string(tcfg.num_hidden_layers) + "-layer target)"
                                                  : std::string())
                       << ": the draft gets the same hidden state twice; --aux-layers picks distinct ones";
}

StreamTargetStats serve_stream_target(MpiCommunicator& world, const StreamLayout& layout, MpiCommunicator& tp,
                                      TargetModel& model, const TargetModelOptions& options,
                                      const TargetConfig& tcfg, const StreamTargetJob& job) {
  const std::vector<int>& aux = job.aux_layers;
  const bool overlap = options.tp_overlap && tp_overlap_unused(tp.size(), job.batch_tokens).empty();
  // "ranks 0-1", "rank 2": a range only where it holds two or more.
  auto ranks = [](int first, int last) {
    return first == last ? "rank " + std::to_string(first)
                         : "ranks " + std::to_string(first) + "-" + std::to_string(last);
  };
  if (world.rank() == 0)
    AERIE_LOG(info) << "train (target): " << job.target_model << " on " << ranks(0, layout.target_ranks - 1) << " ("
                    << layout.replicas() << " replica(s) of tp " << layout.tp << "), "
                    << device_name(options.device) << " " << dtype_name(options.dtype) << ", aux layers "
                    << aux[0] << "," << aux[1] << "," << aux[2]
                    << (overlap ? ", tp all-reduces overlapped with compute" : "") << "; training on "
                    << ranks(layout.target_ranks, world.size() - 1);
  if (world.rank() == 0 && options.tp_overlap && !overlap)
    AERIE_LOG(warning) << "train: --tp-overlap does nothing " << tp_overlap_unused(tp.size(), job.batch_tokens);
  if (world.rank() == 0 && overlap) {
    const int64_t per_call = (job.batch_size + layout.replicas() - 1) / layout.replicas();
    if (const std::string w = tp_overlap_packing_warning("train", job.prepared_path,
                                                         PreparedFile(job.prepared_path).sample_offsets(), per_call,
                                                         job.batch_tokens); !w.empty())
      AERIE_LOG(warning) << w;
  }
  const TargetForward forward = model.hidden_states_forward(aux);
  TargetForwardBatch forward_batch;
  if ((options.device == Device::CUDA || overlap) && job.batch_tokens > 0)
    forward_batch = model.hidden_states_forward_batch(aux);
  return run_stream_target(world, layout, tp, job.prepared_path, tcfg.vocab_size, forward, forward_batch,
                           job.batch_tokens);
}

}  // namespace aerie
