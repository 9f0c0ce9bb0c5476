// The start of `aerie train` before its first step (run_start.h).
#include "train/run_start.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <sstream>

#include "comm/nccl_communicator.h"
#include "core/log.h"
#include "train/sample_source.h"

namespace aerie {

namespace fs = std::filesystem;

Device choose_train_device(const TrainOptions& opts, Communicator& dp) {
  const int rank = dp.rank();
  Device dev = resolve_train_device(opts.device);
  // Every rank of dp resolves the same device (the same option); local_rank() is collective on first use.
  // One GPU per rank (NCCL refuses two ranks on one GPU): "auto" falls back to the CPU when the node has
  // more ranks than GPUs, "cuda" fails.
  // Streaming: only dp's ranks count (the target's ranks may share the GPUs, train/stream.h).
  auto* dp_mpi = dynamic_cast<MpiCommunicator*>(&dp);
  const int node_ranks = dp_mpi != nullptr ? node_size(*dp_mpi) : local_size();
  if (dev == Device::CUDA && node_ranks > cuda::device_count()) {
    AERIE_CHECK(opts.device == "auto", "train: --device cuda with " << node_ranks << " training ranks on a node of "
                                                                   << cuda::device_count()
                                                                   << " GPUs (one GPU per rank)");
    if (rank == 0)
      AERIE_LOG(warning) << "train: " << node_ranks << " training ranks on a node of " << cuda::device_count()
                         << " GPUs: training on the CPU (--device auto)";
    dev = Device::CPU;
  }
  if (dev == Device::CUDA) cuda::select_device(local_rank());
  return dev;
}

void pick_auto_window(TrainOptions& opts, const ShardSet& shards, const TargetConfig& target, int rank) {
  if (!opts.draft_sliding_window_auto) return;
  // From the training samples (the split's held-out ones left out); every rank picks the same window,
  // a resumed run the one its checkpoint picked (check_resumable compares them).
  AERIE_CHECK(opts.draft_attention != "mla", "train: --draft-sliding-window auto goes with the Llama draft only: "
                                             "vLLM's Eagle3DeepseekV2ForCausalLM, which serves the MLA draft, "
                                             "reads no sliding window");
  const DataSplit split = make_data_split(shards.paths, shards.sizes, opts.eval_fraction);
  std::vector<int64_t> lengths;
  lengths.reserve(split.train.size());
  for (int64_t g : split.train) lengths.push_back(shards.lengths.at(static_cast<size_t>(g)));
  const AutoWindow w = auto_sliding_window(lengths, target.max_position_embeddings);
  opts.draft_sliding_window = w.window;
  if (rank == 0) {
    std::ostringstream stats;
    stats << "the 90th percentile (" << w.p90 << " tokens) of the " << w.count
          << " training samples' lengths (mean " << std::llround(w.mean) << ", longest " << w.longest << ")";
    if (w.window > 0)
      AERIE_LOG(info) << "train: --draft-sliding-window auto: " << w.window << " keys, the power of two at or "
                      << "above " << stats.str();
    else
      AERIE_LOG(warning) << "train: --draft-sliding-window auto: no window: the power of two at or above "
                         << stats.str() << " reaches the target's max_position_embeddings "
                         << target.max_position_embeddings << ", so it would never apply";
  }
}

// The draft weights of --init-draft (opts.init_draft: a checkpoint folder, or a run folder's newest complete
// checkpoint, whose folder is returned in `resolved`): its draft config and vocabulary must be this run's (the
// first difference is named), its weights finite, and opts.output_dir must lie outside it (the warm run would
// write into the draft it starts from). A checkpoint of another target than `model` is taken with a warning.
DraftWeights warm_start_weights(const TrainOptions& opts, const DraftConfig& cfg, const DraftVocab& vocab,
                                const TargetFingerprint& model, int rank, std::string& resolved) {
  const std::string& path = opts.init_draft;
  std::string dir = path;
  if (!fs::exists(path + "/draft.safetensors")) {
    const auto latest = latest_checkpoint(path);
    AERIE_CHECK(latest, "train: --init-draft " << path << " is neither a checkpoint folder (no draft.safetensors) "
                                               << "nor a run folder with a complete checkpoint (an export folder is "
                                               << "not read: give the run's checkpoint)");
    dir = *latest;
  }
  resolved = fs::weakly_canonical(dir).string();
  {
    const fs::path out = fs::weakly_canonical(opts.output_dir), init = fs::weakly_canonical(path);
    const auto [end, _] = std::mismatch(init.begin(), init.end(), out.begin(), out.end());
    AERIE_CHECK(end != init.end(), "train: --output " << opts.output_dir << " lies inside --init-draft " << path
                                                      << ": the warm run would write into the draft it starts from; "
                                                      << "use another --output");
  }
  Checkpoint init = load_checkpoint(dir, /*optimizer_state=*/false);  // a new optimizer state
  const nlohmann::json theirs = init.config.to_json(), mine = cfg.to_json();
  const nlohmann::json patch = nlohmann::json::diff(theirs, mine);  // RFC 6902 operations, theirs -> mine
  if (!patch.empty()) {
    // The first difference, as a dotted key; an array is shown whole (aux_layers [1,2,3], not its element 0).
    nlohmann::json::json_pointer at(patch[0]["path"].get<std::string>());
    while (!at.empty() && theirs.contains(at.parent_pointer()) && theirs[at.parent_pointer()].is_array())
      at = at.parent_pointer();
    std::string key = at.to_string().substr(1);
    std::replace(key.begin(), key.end(), '/', '.');
    auto shown = [&](const nlohmann::json& j) {
      return j.contains(at) ? j[at].dump() : std::string("(absent: off)");  // to_json leaves out options that are off
    };
    AERIE_THROW("train: --init-draft " << dir << ": its draft has " << key << " = " << shown(theirs) << ", this run's "
                                       << shown(mine)
                                       << "; give this run the draft options (and shards) that draft was trained with");
  }
  AERIE_CHECK(init.vocab.d2t == vocab.d2t && init.vocab.t2d == vocab.t2d,
              "train: --init-draft " << dir << ": its draft vocabulary differs from --vocab; pass its "
                                     << "draft_vocab.safetensors as --vocab");
  for (const auto& [name, t] : init.weights.named())  // checkpoints hold F32 host tensors (load_checkpoint checks)
    AERIE_CHECK(all_finite(*t), "train: --init-draft " << dir << ": its weight " << name << " is not finite");
  const TargetFingerprint trained_on = recorded_target(init.provenance);
  const std::string diff = trained_on.config_sha256.empty() ? std::string() : trained_on.difference(model);
  if (!diff.empty() && rank == 0)
    AERIE_LOG(warning) << "train: --init-draft " << dir << " was trained against another target than --model "
                       << opts.model_dir << " (" << diff << "); starting from it anyway";
  return std::move(init.weights);
}

// Runs `checks` (the checks of a fresh start or resume) on every rank of dp. With `whole_job` (an offline run:
// dp is every rank of the job) through comm's agree_on_refusal, so a refusal ends the job with status 1 and
// the message once. In a streaming run the target's ranks wait outside dp for the plan, so the error stays an
// aerie::Error (main() aborts the job, which releases them).
void refusals_agreed(Communicator& dp, bool whole_job, const std::function<void()>& checks) {
  if (whole_job)
    aerie::agree_on_refusal(dp, "train", checks);
  else
    checks();
}

RunStart start_or_resume(TrainOptions& opts, Communicator& dp, bool streamed, const TargetConfig& target,
                         const TargetFingerprint& model_fp, const ShardSet& shards, const TargetHead& head) {
  const int rank = dp.rank();
  RunStart start;
  Checkpoint& ck = start.ck;
  std::string& vocab_file = start.vocab_file;
  start.latest = latest_checkpoint(opts.output_dir);
  const std::optional<std::string>& latest = start.latest;
  const bool whole_job = !streamed;  // offline: dp is every rank of the job
  refusals_agreed(dp, whole_job, [&] {
    if (latest) {
      if (rank == 0) AERIE_LOG(info) << "train: resuming from " << *latest;
      if (rank == 0 && !opts.init_draft.empty())
        AERIE_LOG(info) << "train: --init-draft ignored: the run resumes from its own checkpoint";
      AERIE_CHECK(fs::exists(fs::path(*latest) / "optimizer.safetensors"),
                  "train: resuming from " << *latest << " needs its optimizer state, optimizer.safetensors, which is "
                                          << "gone (deleted to save space?): export and eval do without it; to train "
                                          << "on from its weights with a new optimizer state, give another --output and "
                                          << "--init-draft " << *latest);
      ck = load_checkpoint(*latest);
      // The options whose default changed keep the checkpoint's setting unless given: a requeued job resumes
      // as it started without naming them.
      for (const std::string& line : opts.adopt_checkpoint_defaults(ck.train_options))
        if (rank == 0) AERIE_LOG(info) << "train: " << line;
      opts.check_resumable(ck.train_options);
      check_resume_provenance(ck.provenance, *latest, opts, model_fp, shards, rank);
      check_same_shards(shards, ck.state.split, streamed);
      AERIE_CHECK(ck.config.aux_layers == shards.aux_layers,
                  "resume: the checkpoint's draft reads aux layers " << nlohmann::json(ck.config.aux_layers).dump() << ", "
                      << (streamed ? "--aux-layers gives " : "the shards hold ")
                      << nlohmann::json(shards.aux_layers).dump()
                      << (streamed ? ": rerun with --aux-layers of the checkpoint, or use another --output"
                                            : ": rerun with the shards it was trained on, or use another --output"));
      ck.state.split.shards = shards.paths;
      vocab_file = *latest + "/draft_vocab.safetensors";
      if (!opts.vocab_path.empty() && fs::exists(opts.vocab_path)) {
        DraftVocab given = load_draft_vocab(opts.vocab_path);
        if ((given.d2t != ck.vocab.d2t || given.t2d != ck.vocab.t2d) && rank == 0)
          AERIE_LOG(warning) << "train: " << opts.vocab_path << " differs from the checkpoint's draft vocabulary; "
                             << "the checkpoint's is kept (it belongs to the draft)";
      }
      AERIE_CHECK(ck.config.vocab_size == target.vocab_size && ck.config.hidden_size == target.hidden_size,
                  "resume: the checkpoint's draft (V " << ck.config.vocab_size << ", H " << ck.config.hidden_size
                                                      << ") does not fit the target in " << opts.model_dir);
    } else {
      AERIE_CHECK(!opts.vocab_path.empty(), "train: --vocab is required for a fresh run");
      vocab_file = opts.vocab_path;
      ck.vocab = load_draft_vocab(vocab_file);
      AERIE_CHECK(ck.vocab.vocab_size() == target.vocab_size,
                  vocab_file << ": t2d has V = " << ck.vocab.vocab_size() << ", the target's V is " << target.vocab_size);
      ck.config = opts.apply_draft_shape(DraftConfig::from_target(target, ck.vocab.draft_vocab_size(), shards.aux_layers,
                                                                   opts.draft_attention == "mla"));
      // Initialised on the host (the checkpoint's copy); the device copy is made below.
      const Tensor lm_host = (head.lm_head.device() == Device::CPU ? head.lm_head : head.lm_head.to_device(Device::CPU))
                                 .to(DType::F32);  // a BF16 head on a GPU: its stored values, widened exactly
      if (opts.init_draft.empty()) {
        ck.weights =
            init_draft_weights(ck.config, lm_host, ck.vocab.selected(), opts.seed, opts.lm_head_init == "random");
      } else {
        AERIE_CHECK(opts.lm_head_init != "random", "train: --lm-head-init random with --init-draft: the lm_head "
                                                   "comes from the --init-draft checkpoint; leave out one of them");
        std::string resolved;
        ck.weights = warm_start_weights(opts, ck.config, ck.vocab, model_fp, rank, resolved);
        if (rank == 0) AERIE_LOG(info) << "train: the draft starts from the weights of " << resolved;
        opts.init_draft = resolved;  // recorded in the checkpoints' train options as the folder read
      }
      ck.adam_m = DraftWeights::zeros(ck.config);
      ck.adam_v = DraftWeights::zeros(ck.config);
      ck.state.split = make_data_split(shards.paths, shards.sizes, opts.eval_fraction);
      ck.state.seed = opts.seed;
      ck.state.batch_size = opts.batch_size;
    }
  });
  ck.train_options = opts.to_json();
  ck.provenance = make_provenance(opts, model_fp, target, shards, vocab_file);
  return start;
}

void log_run_start(const TrainOptions& opts, const DataSplit& split, bool streamed, size_t num_shards, int64_t total,
                   int dp_size, int64_t steps_per_epoch, const LrSchedule& sched, const DraftConfig& cfg, Device dev) {
  std::ostringstream weight_decay_text;
  if (opts.weight_decay != 0) weight_decay_text << ", weight decay " << opts.weight_decay;
  AERIE_LOG(info) << "train: " << split.train.size() << " training samples (" << split.eval.size()
                  << " held out) "
                  << (streamed ? "of " + opts.prepared_path + ", streamed from the target's ranks"
                                        : "in " + std::to_string(num_shards) + " shards")
                  << ", " << total << " steps of "
                  << opts.batch_size << " samples on " << dp_size << (dp_size == 1 ? " dp rank, " : " dp ranks, ")
                  << steps_per_epoch << " steps per epoch, warmup " << sched.warmup_steps
                  << " steps (--warmup-ratio " << opts.warmup_ratio << " of " << total << ", rounded down), K = " << cfg.draft_vocab_size << ", aux layers "
                  << nlohmann::json(cfg.aux_layers).dump() << ", device " << device_name(dev) << ", compute "
                  << (resolve_compute_dtype(opts.precision, dev) == DType::BF16 ? "bf16 (fp32 master weights)" : "fp32")
                  << ", draft layer: "
                  << (cfg.is_mla()
                          ? "MLA, " + std::to_string(cfg.num_attention_heads) + " heads, " +
                                (cfg.q_lora_rank > 0 ? "q_lora " + std::to_string(cfg.q_lora_rank)
                                                           : std::string("no query LoRA (q_proj)")) +
                                ", kv_lora " +
                                std::to_string(cfg.kv_lora_rank) + ", head dims " +
                                std::to_string(cfg.qk_nope_head_dim) + " + " +
                                std::to_string(cfg.qk_rope_head_dim) + " / v " +
                                std::to_string(cfg.v_head_dim)
                          : std::to_string(cfg.num_attention_heads) + " query heads, " +
                                std::to_string(cfg.num_key_value_heads) + " kv heads, head dim " +
                                std::to_string(cfg.head_dim))
                  << ", MLP " << cfg.intermediate_size
                  << (cfg.norm_before_residual ? ", norm_before_residual (EAGLE-3.1)" : "")
                  << (cfg.norm_output ? ", norm_output (EAGLE-3.1)" : "")
                  << (cfg.norm_before_fc ? ", norm_before_fc (EAGLE-3.1)" : "")
                  << (cfg.fc_norm ? ", fc_norm (EAGLE-3.1)" : "")
                  << (cfg.sliding_window > 0
                          ? ", sliding window " + std::to_string(cfg.sliding_window) +
                                (cfg.sliding_window == 1 ? " key" : " keys")
                          : std::string())
                  << ", AdamW betas " << opts.adam_beta1 << " / " << opts.adam_beta2
                  << weight_decay_text.str()
                  << ", lm_head init "
                  << opts.lm_head_init << ", loss over " << (opts.loss_normalization == "all" ? "all" : "trained")
                  << " rows";
  if (opts.batch_size < dp_size)
    AERIE_LOG(warning) << "train: --batch-size " << opts.batch_size << " is below the " << dp_size
                       << " dp ranks: " << dp_size - opts.batch_size
                       << (dp_size - opts.batch_size == 1 ? " of them gets no sample and idles" : " of them get no sample and idle")
                       << " each step (a resumed run keeps its batch size; start a run with a batch of at least the "
                       << "most ranks it will train on)";
}

}  // namespace aerie
