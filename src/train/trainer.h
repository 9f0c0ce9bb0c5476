// Data-parallel training of the EAGLE-3 draft (eagle3.md section 4): training-time test over S steps,
// AdamW on fp32 master weights, linear warmup + cosine lr, global gradient clipping, checkpoints and
// resume. Every dp rank holds the whole draft; a global step of B samples gives rank r the batch entries
// r, r + dp, ...; the per-step valid counts and the gradients are summed over dp, so all ranks apply the
// same update.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "comm/communicator.h"
#include "data/vocab.h"
#include "model/draft.h"
#include "train/stream.h"

namespace aerie {

/// The options of `aerie train` (defaults: eagle3.md section 4, SpecForge's).
struct TrainOptions {
  std::string model_dir, shards_dir, vocab_path, output_dir;
  /// Streaming training (train/stream.h): the prepared file whose samples the target's ranks compute the
  /// hidden states of (no shards; shards_dir is then empty). Set by `train --prepared`.
  std::string prepared_path;
  /// Streaming: the target the target's ranks run (`--target-model`; its fingerprint is the hidden states'
  /// provenance, checked against model_dir's as offline train checks the shards' target).
  std::string target_model_dir;
  /// Streaming: how the target's ranks run its linears (ShardMeta::target_gemm: "w8a8-fp8-block ..." with
  /// train --fp8-gemm, else empty), recorded in the checkpoints' provenance as extract records it in shards.
  std::string stream_target_gemm;
  /// Streaming: steps the target may compute ahead of the step being trained (StreamPlan::queue, >= 0);
  /// more hides the target's jitter, each step ahead holds one batch of hidden states in messages.
  int64_t stream_queue = 2;
  /// The recipe (where aerie's and SpecForge's differ; resume options). AdamW's betas
  /// (0.9 / 0.999, torch's default and SpecForge's: measured in docs/design.md; a checkpoint without the key
  /// was trained with 0.9 / 0.95, an earlier default; a resumed run takes its checkpoint's
  /// beta2 unless adam_beta2_given, as adopt_checkpoint_defaults says); lm_head_init "target" (the target's
  /// rows of the draft vocabulary) or "random" (nn.Linear's init, SpecForge's); loss_normalization
  /// "valid" (each TTT step's loss over its trained rows, eagle3.md section 4) or "all" (over all rows of
  /// the global batch, sum of the sample lengths: SpecForge's mean over the [B, T] positions).
  /// weight_decay: AdamW's decoupled decay of every trained weight (torch's AdamW: p *= 1 - lr * wd before
  /// the update; kernels/optim.h), 0 by default as in eagle3.md, the EAGLE code and SpecForge.
  double adam_beta1 = 0.9, adam_beta2 = 0.999, weight_decay = 0.0;
  /// The beta2 of a checkpoint without the key (an earlier aerie's default).
  static constexpr double kAdamBeta2Unrecorded = 0.95;
  bool adam_beta2_given = false;  // set on the command line or in a config (jobs/train.cc)
  std::string lm_head_init = "target", loss_normalization = "valid";
  /// The aux layers the run expects (`train --aux-layers`; empty: any). Streaming computes these; offline
  /// the shards must hold them (an error naming both otherwise), so one .ini serves both modes.
  std::vector<int> aux_layers;
  int64_t steps = 0;           // total optimizer steps; 0: from epochs
  int64_t epochs = 0;          // used when steps == 0 (1 when both are 0)
  int64_t batch_size = 8;      // samples per global step
  double lr = 1e-4, warmup_ratio = 0.015, max_grad_norm = 0.5;
  int ttt_steps = 7;
  int64_t checkpoint_every = 0;  // 0: only at the end
  int keep_checkpoints = 0;      // complete checkpoints kept (the newest); 0: all
  int64_t log_every = 10;
  uint64_t seed = 0;
  double eval_fraction = 0.05;
  /// Held-out samples scored at every checkpoint (teacher-forced acc_k and tau_sim, the first ones of the
  /// split's held-out list, as `aerie eval --num-eval-samples` takes them; 0: none). Not a resume option.
  int64_t heldout_samples = 64;
  /// A warm start (`train --init-draft`; empty: none): a checkpoint folder (step-%08d) or a run folder (its
  /// newest complete checkpoint) whose draft weights a fresh run starts from, in place of eagle3.md's
  /// initialisation; the optimizer state, the data order and the schedule start afresh. run_training throws
  /// aerie::Error naming the folder when its draft (config.json: shape, aux layers, options) or its draft
  /// vocabulary differs from this run's. Not a resume option: a resume takes the weights of its own
  /// checkpoint and ignores it.
  std::string init_draft;
  /// Where the draft trains: "cpu", "cuda" (rank r uses GPU local_rank() % count; throws without one, or
  /// with more ranks on a node than GPUs) or "auto" (cuda when cuda::available() and the node has no
  /// more ranks than GPUs, else cpu). Not a resume option: a run may resume on another device
  /// (checkpoints are written from host copies in one format).
  std::string device = "cpu";  // `aerie train --device` defaults to "auto"
  /// The compute precision (eagle3.md section 4): "auto" (bf16 on CUDA, f32 on the CPU), "bf16" (fp32
  /// master weights, gradients and AdamW moments; bf16 GEMM inputs with fp32 accumulation: see
  /// ttt_forward_backward) or "f32" (everything fp32, the reference). Not a resume option.
  std::string precision = "auto";
  /// The draft's own attention / MLP shape (0: from the target, DraftConfig::from_target): query heads,
  /// kv heads (must divide the heads), head dim (even) and intermediate size, e.g. SpecForge's
  /// DeepSeek-V3 draft 56 / 8 / 128 / 40960. A resume option: a resumed run must give the same ones.
  int64_t draft_heads = 0, draft_kv_heads = 0, draft_head_dim = 0, draft_intermediate = 0;
  /// The draft layer's attention: "llama" (the original EAGLE-3 layer, grouped-query attention) or "mla"
  /// (DeepSeek-V2/V3 multi-head latent attention with the target's LoRA ranks and head dims, exported as
  /// vLLM's Eagle3DeepseekV2ForCausalLM; needs an MLA target; DraftConfig::is_mla). A resume option.
  std::string draft_attention = "llama";
  /// EAGLE-3.1's norm_before_residual for the draft (DraftConfig::norm_before_residual; exported as the
  /// config field vLLM and speculators read; SGLang's Llama draft has no such option). On by default
  /// (speculators' default; measured in docs/design.md). A resume option: a resumed run takes its
  /// checkpoint's setting (absent in checkpoints before the default changed: off) unless
  /// draft_norm_before_residual_given, when the two must agree.
  bool draft_norm_before_residual = true;
  bool draft_norm_before_residual_given = false;  // set on the command line or in a config (jobs/train.cc)
  /// EAGLE-3.1's norm_output for the draft (DraftConfig::norm_output; exported as config.norm_output,
  /// which vLLM, SGLang and speculators read). A resume option.
  bool draft_norm_output = false;
  /// EAGLE-3.1's norm_before_fc for the draft (DraftConfig::norm_before_fc: a trained RMSNorm input_norm
  /// [3 H_t] before fc; exported as config.norm_before_fc and the tensor input_norm.weight, which vLLM,
  /// SGLang and speculators read). A resume option.
  bool draft_norm_before_fc = false;
  /// EAGLE-3.1's per-chunk norms for the draft (DraftConfig::fc_norm: trained RMSNorms fc_norm.{0,1,2}
  /// [H_t], one per aux chunk, before fc; exported as config.fc_norm and those tensors, which SpecForge and
  /// speculators read). Not with draft_norm_before_fc. A resume option.
  bool draft_fc_norm = false;
  /// A sliding window for the draft's attention, in keys (DraftConfig::sliding_window; exported as
  /// config.layer_types ["sliding_attention"] and config.sliding_window, which vLLM reads); 0: none. A
  /// resume option.
  int64_t draft_sliding_window = 0;
  /// `--draft-sliding-window auto`: run_training sets draft_sliding_window from the training samples'
  /// lengths (auto_sliding_window) before the draft is made or a checkpoint compared; recorded in the
  /// checkpoints' options beside the window it picked.
  bool draft_sliding_window_auto = false;
  /// Train on a shard folder that lacks some chunks of its extraction (a warning instead of a refusal).
  bool allow_missing_shards = false;
  /// Train (or resume) with a --model whose fingerprint differs from the shards' (or the checkpoint's)
  /// target: a warning instead of a refusal (e.g. a quantized copy of the model the shards come from).
  bool allow_other_target = false;

  nlohmann::json to_json() const;
  /// On resume, the options whose default changed take the checkpoint's setting unless given (so a
  /// requeued job resumes as it started without naming them): draft_norm_before_residual (a checkpoint
  /// without the key: off) and adam_beta2 (without the key: 0.95). Returns one line per option changed,
  /// for the log (empty when none).
  std::vector<std::string> adopt_checkpoint_defaults(const nlohmann::json& checkpoint_options);
  /// `cfg` with the draft_* options that are set (> 0) replacing its shape (an MLA draft takes only
  /// draft_intermediate: its heads are the target's latent attention), and norm_before_residual /
  /// norm_output / norm_before_fc / fc_norm / sliding_window from draft_norm_before_residual /
  /// draft_norm_output / draft_norm_before_fc / draft_fc_norm / draft_sliding_window. Throws aerie::Error naming
  /// the option when kv heads do not divide the heads or the head dim is odd, or when the draft does not fit
  /// the machine's memory (check_draft_fits_memory).
  DraftConfig apply_draft_shape(DraftConfig cfg) const;
  /// Throws aerie::Error naming the draft's sizes and the options that set them when training the draft of
  /// `cfg` needs more memory than this machine has (16 bytes a parameter), before anything is allocated.
  void check_draft_fits_memory(const DraftConfig& cfg) const;
  /// The options that decide the weights (steps, epochs, batch size, lr, warmup, clipping, TTT steps,
  /// seed, eval fraction): a resumed run must give the same ones. Throws aerie::Error naming the first
  /// option that differs from `checkpoint_options` (a checkpoint's config.json "train").
  void check_resumable(const nlohmann::json& checkpoint_options) const;
};

/// The window `train --draft-sliding-window auto` picks, and the statistics it came from.
struct AutoWindow {
  int64_t window = 0;       // keys; 0: no window (the pick reached max_position_embeddings)
  int64_t p90 = 0;          // the 90th percentile (nearest rank) of the lengths, tokens
  int64_t longest = 0;      // tokens
  double mean = 0;          // tokens
  int64_t count = 0;        // samples
};

/// The sliding window for `--draft-sliding-window auto`: the smallest power of two at or above the 90th
/// percentile (nearest rank: the ceil(0.9 n)-th smallest) of `lengths`, the training samples' token counts,
/// so that the draft never attends further back than distances that nine training samples in ten reach
/// (docs/design.md, "The sliding window": on the demo, whose 90th percentile is 137 tokens, a window of 256
/// kept acceptance +21.5 to +24.7% higher on prompts four times the mean sample and lost nothing on short
/// ones). A pick at or above `max_position_embeddings` (> 0; <= 0: unknown) would never apply: window 0.
/// Throws aerie::Error when `lengths` is empty or holds a length below 1.
AutoWindow auto_sliding_window(const std::vector<int64_t>& lengths, int64_t max_position_embeddings);

/// AdamW moments and the number of updates made.
struct AdamState {
  DraftWeights m, v;
  int64_t step = 0;
  static AdamState zeros(const DraftConfig& cfg, Device device = Device::CPU);
};

/// TrainOptions::device resolved: "cpu" -> CPU, "cuda" -> CUDA (throws aerie::Error naming
/// cuda::unavailable_reason() when there is no usable GPU), "auto" -> CUDA when cuda::available(), else
/// CPU. Throws on any other name.
Device resolve_train_device(const std::string& name);

/// TrainOptions::precision resolved for `device`: "f32" -> F32, "bf16" -> BF16, "auto" -> BF16 on CUDA,
/// F32 on the CPU. Throws aerie::Error on any other name.
DType resolve_compute_dtype(const std::string& precision, Device device);

/// The parts of a step's recipe that train_step takes (TrainOptions' adam_beta1/2, weight_decay,
/// loss_normalization).
struct StepRecipe {
  double adam_beta1 = 0.9, adam_beta2 = 0.999, weight_decay = 0.0;
  /// The beta2 of a checkpoint without the key (an earlier aerie's default).
  static constexpr double kAdamBeta2Unrecorded = 0.95;
  bool normalize_by_all_rows = false;  // loss_normalization "all"
};

/// The weights of the TTT steps' loss sums in the gradient (eagle3.md section 4): 0.8^k / max(1, valid[k])
/// (valid: the global batch's trained rows of step k), or with recipe.normalize_by_all_rows 0.8^k /
/// max(1, rows) (rows: all positions of the global batch). Throws aerie::Error when valid.size() != S.
std::vector<double> ttt_step_weights(const std::vector<int64_t>& valid, int64_t rows, int S, const StepRecipe& recipe);

/// Global sums of one or more steps (over samples and dp ranks).
struct StepMetrics {
  std::vector<double> loss_sum;    // [S] sum of valid * CE
  std::vector<int64_t> valid, correct, acc_rows;  // [S]
  int64_t tokens = 0;              // tokens of the samples
  double grad_norm = 0;            // before clipping (last step)
  void add(const StepMetrics& o);
  /// loss_k = loss_sum_k / max(1, valid_k); loss = sum_k 0.8^k loss_k (eagle3.md section 4).
  std::vector<double> loss_k() const;
  double loss() const;
  /// acc_k = correct_k / acc_rows_k (0 when no row); tau_sim = 1 + sum_k prod_{j<=k} acc_j.
  std::vector<double> acc_k() const;
  double tau_sim() const;
};

/// Buffers of a step: the rank's gradient sum and one sample's gradient (DraftWeights::zeros shapes, F32;
/// `sample` is made by the first train_step that has more than one local sample),
/// and for bf16 compute the BF16 compute copy of the weights, refreshed from the masters at the start of
/// every train_step (so it always matches them, whoever changed them). `comm_stream`: the stream of the
/// overlapped gradient all-reduce (made on first use, destroyed with the scratch).
struct StepScratch {
  DraftWeights grads, sample;
  DType compute_dtype = DType::F32;
  DraftWeights compute;  // BF16 matrices when compute_dtype is BF16 (else empty)
  std::shared_ptr<void> comm_stream;
  /// compute: DType::F32 or DType::BF16. The two-argument form picks resolve_compute_dtype("auto", device):
  /// bf16 on CUDA, fp32 on the CPU.
  static StepScratch zeros(const DraftConfig& cfg, Device device, DType compute);
  static StepScratch zeros(const DraftConfig& cfg, Device device = Device::CPU);
};

/// One global optimizer step on this rank's samples `local` (the other dp ranks call it with theirs):
///  1. valid_k of every local sample (ttt_valid_counts), summed over dp;
///     step_weight[k] = 0.8^k / max(1, global valid_k);
///  2. grads = sum over local samples of d(sum_k step_weight[k] loss_sum_k)/dw (ttt_forward_backward
///     into a zeroed per-sample buffer, then added in sample order), all-reduced (sum) over dp; under
///     bf16 compute (scratch.compute_dtype) the forward/backward runs on scratch.compute, refreshed from
///     w first, and the gradients stay F32;
///  3. global norm clipping at max_grad_norm, AdamW (beta 0.9/0.95, eps 1e-8, wd 0) with `lr`,
///     update number opt.step + 1.
/// Device: the weights, moments and scratch (and embed_tokens) all on one device, CPU or CUDA; the samples'
/// tensors may be on the host or there (ttt_forward_backward copies them). `grad_comm` (optional, default
/// `dp`): the communicator of the gradient all-reduce, e.g. an NcclCommunicator over the same ranks when
/// the gradients are on a GPU; `dp` itself then only reduces host tensors (counts, losses). With one
/// rank no gradient all-reduce is made. Overlap: when grad_comm is an NcclCommunicator of several ranks,
/// each parameter's all-reduce is queued on scratch's comm stream (all_reduce_sum_async) as soon as its
/// gradient is final in the backward of the LAST local sample (ttt_forward_backward's on_grad_ready,
/// in ttt_gradient_ready_order(), the same order on every rank), and the comm stream is synchronised
/// before step 3; a rank without samples queues them all in that order. Steps 3 is adamw_step_clipped (the norm in double; on CUDA one
/// synchronisation).
/// Returns the global metrics. All ranks end with the same weights. Another dp sums the same per-sample
/// gradients in another order ((g0+g1)+(g2+g3) instead of ((g0+g1)+g2)+g3), so the weights agree up to
/// fp32 rounding. With B = dp = 2 they are bitwise equal: each sample's gradient is computed alone, so
/// both runs compute g0 + g1 (x + y is commutative in IEEE arithmetic); with more ranks that also needs
/// MPI to sum in rank order, which MPI does not promise.
StepMetrics train_step(const DraftConfig& cfg, DraftWeights& w, AdamState& opt, const Tensor& embed_tokens,
                       const std::vector<TTTSample>& local, const DraftVocab& vocab, int ttt_steps, double lr,
                       double max_grad_norm, Communicator& dp, StepScratch& scratch,
                       Communicator* grad_comm = nullptr, const StepRecipe& recipe = {});

struct TrainResult {
  std::string checkpoint;         // the last checkpoint folder written (or resumed from)
  int64_t step = 0, total_steps = 0;
  int stop_signal = 0;            // the signal that stopped the run early (0: ran to the end)
  int64_t skipped_nonfinite = 0;  // sample draws skipped for non-finite hidden states (all ranks, this run)
};

/// `aerie train`: collective over `dp` (every rank a dp replica). Rank 0 holds the run folder's lock
/// (OUTPUT/.aerie.lock, io/output_lock.h; throws aerie::Error naming the holder when another job has it)
/// unless this process holds it already (jobs/train.cc takes it first). Resumes from the latest complete
/// checkpoint of opts.output_dir if there is one (the vocabulary then comes from the checkpoint, not
/// from --vocab), writes checkpoints every opts.checkpoint_every steps and at the end, logs metrics on
/// rank 0 every opts.log_every steps (also appended to output_dir/metrics.jsonl and, in a build with
/// protobuf, to a TensorBoard event file output_dir/events.out.tfevents.* that each run or resume starts:
/// io/event_file.h, tags in docs/formats.md), and writes output_dir/data_split.json (the held-out samples
/// eval uses). Before each checkpoint it scores up to opts.heldout_samples held-out samples (collective;
/// rank 0 logs them, appends a line to output_dir/heldout.jsonl and the heldout/ tags). A resume drops
/// what a killed run logged past its checkpoint from metrics.jsonl, heldout.jsonl and the event files.
/// Preemption: SIGTERM, SIGINT or SIGUSR1 on any rank (Slurm sends SIGTERM before killing a job, or
/// USR1 with --signal) makes every rank finish the current step, write a checkpoint and return (the flag
/// is max-reduced over dp after each step); a second signal kills as usual. The previous handlers are
/// restored on return.
/// Non-finite data: a sample whose hidden states hold a NaN or infinity is skipped with a warning naming its
/// shard and sample, and counted (TrainResult::skipped_nonfinite, skipped_nonfinite in metrics.jsonl); a
/// step with no finite sample throws. A non-finite gradient norm from finite samples throws naming them.
/// Provenance: the shards must be one complete extraction (the same recorded target and
/// prepared file in every shard, no chunk missing unless opts.allow_missing_shards) of the target in
/// opts.model_dir (TargetFingerprint: config.json and weights; unless opts.allow_other_target; shards of
/// extract --random-weights are compared by config.json); a resume also checks --model and --shards
/// against the checkpoint's provenance, which every checkpoint records. Shards and checkpoints of an older
/// aerie without provenance give a warning instead.
/// Throws aerie::Error on bad options, data that disagrees with the target or the checkpoint (naming what
/// differs), I/O errors.
/// Streaming (`stream` non-null, train/stream.h): the samples' hidden states come from the target's ranks
/// instead of shards; opts.prepared_path names the prepared file (global sample g = prepared sample g, the
/// same split and batches as offline train on the shards of that file), the aux layers are the stream's,
/// the checkpoints record the prepared file's fingerprint instead of the shards', and a checkpoint of one
/// mode does not resume in the other (refused, naming both). Every step's credit and the held-out scoring
/// go through `stream`; before returning, the trainers drain what the target computed ahead.
TrainResult run_training(const TrainOptions& opts, Communicator& dp, StreamClient* stream = nullptr);

}  // namespace aerie
