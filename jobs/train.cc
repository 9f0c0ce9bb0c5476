// aerie train: data-parallel training of the EAGLE-3 draft (eagle3.md section 4) on the hidden-state
// shards of `aerie extract`, with the draft vocabulary of `aerie vocab`. Every rank is a dp replica.
//
//   mpirun -np 2 aerie train --model TARGET_DIR --shards SHARD_DIR --vocab draft_vocab.safetensors ...
//       --output RUN_DIR --epochs 2 --batch-size 8
//
// Writes RUN_DIR/checkpoints/step-%08d/ (every --checkpoint-every steps and at the end), RUN_DIR/metrics.jsonl,
// RUN_DIR/heldout.jsonl (held-out acc_k / tau_sim at each checkpoint), TensorBoard event files
// RUN_DIR/events.out.tfevents.* (a build with protobuf) and RUN_DIR/data_split.json (the held-out samples). Rerunning the same command resumes from the newest
// complete checkpoint (also with another number of ranks). SIGTERM/SIGINT/SIGUSR1 (Slurm preemption)
// stop the run after the current step with a checkpoint; the exit status is then 3.
// --device cuda (the default `auto` when a GPU is usable) trains on the GPU of each rank (local rank %
// GPUs): weights, AdamW moments, activations and the TTT forward/backward there, gradients summed over
// NCCL; checkpoints are the same files as on the CPU (a run may resume on the other device).
//
// Streaming (no shards, the protocol in src/train/stream.h):
//   mpirun -np 3 aerie train --target-model TARGET_DIR --prepared prepared.h5 --target-ranks 1 --vocab ...
//       --output RUN_DIR
// World ranks 0 .. --target-ranks-1 run the target (replicas of --tp ranks, as extract) and send each
// step's hidden states to the other ranks, which train as above; the data order, checkpoints, resume and
// the result are those of extract + train on the same prepared file. The two sides may share GPUs.
#include <algorithm>
#include <cctype>
#include <cmath>
#include <filesystem>
#include <sstream>
#include <string>

#include "comm/communicator.h"
#include "core/error.h"
#include "core/log.h"
#include "core/stop_signals.h"
#include "data/shard.h"
#include "data/vocab.h"
#include "comm/nccl_communicator.h"
#include "data/extract.h"
#include "jobs/jobs.h"
#include "jobs/target_device.h"
#include "model/target.h"
#include "train/stream.h"
#include "train/stream_target.h"
#include "train/checkpoint.h"
#include "train/trainer.h"

namespace aerie::jobs {

namespace {

namespace fs = std::filesystem;

/// A bad option value: aerie::UsageError (exit status 2) prefixed with the job.
#define TRAIN_REQUIRE(cond, msg) AERIE_USAGE_CHECK(cond, "aerie train: " << msg)

/// The checks that need neither the target nor the shards' contents, so that a bad command line is
/// reported before run_training reads the target's embedding (GiBs for a large model) and every shard.
/// Option values: UsageError (exit 2); missing or wrong files: aerie::Error naming the option and path.
void check_train_inputs(const TrainOptions& o) {
  TRAIN_REQUIRE(o.steps >= 0, "--steps " << o.steps << " is negative (0: --epochs)");
  TRAIN_REQUIRE(o.epochs >= 0, "--epochs " << o.epochs << " is negative");
  TRAIN_REQUIRE(o.steps > 0 || o.epochs > 0, "--steps 0 and --epochs 0 train nothing: give --steps N or --epochs N");
  TRAIN_REQUIRE(o.batch_size >= 1, "--batch-size must be >= 1, got " << o.batch_size);
  TRAIN_REQUIRE(std::isfinite(o.lr) && o.lr >= 0, "--lr must be a finite number >= 0, got " << o.lr);
  TRAIN_REQUIRE(o.warmup_ratio >= 0 && o.warmup_ratio <= 1,
          "--warmup-ratio must lie in [0, 1], got " << o.warmup_ratio);
  TRAIN_REQUIRE(o.max_grad_norm >= 0, "--max-grad-norm must be >= 0 (0: off), got " << o.max_grad_norm);
  TRAIN_REQUIRE(o.ttt_steps >= 1, "--ttt-steps must be >= 1, got " << o.ttt_steps);
  TRAIN_REQUIRE(o.draft_heads >= 0 && o.draft_kv_heads >= 0 && o.draft_head_dim >= 0 && o.draft_intermediate >= 0,
                "--draft-heads, --draft-kv-heads, --draft-head-dim and --draft-intermediate must be >= 0 (0: the "
                "target's)");
  TRAIN_REQUIRE(o.checkpoint_every >= 0, "--checkpoint-every " << o.checkpoint_every <<
                                       " is negative (0: only at the end)");
  TRAIN_REQUIRE(o.keep_checkpoints >= 0, "--keep-checkpoints " << o.keep_checkpoints << " is negative (0: all)");
  TRAIN_REQUIRE(o.log_every >= 1, "--log-every must be >= 1, got " << o.log_every);
  TRAIN_REQUIRE(o.eval_fraction >= 0 && o.eval_fraction < 1,
          "--eval-fraction must lie in [0, 1), got " << o.eval_fraction);
  TRAIN_REQUIRE(o.adam_beta1 >= 0 && o.adam_beta1 < 1 && o.adam_beta2 >= 0 && o.adam_beta2 < 1,
                "--adam-beta1 and --adam-beta2 must lie in [0, 1), got " << o.adam_beta1 << " and " << o.adam_beta2);
  TRAIN_REQUIRE(std::isfinite(o.weight_decay) && o.weight_decay >= 0,
                "--weight-decay must be finite and >= 0, got " << o.weight_decay);
  // A step multiplies every weight by 1 - lr wd: at lr wd >= 1 the peak step zeroes or flips them.
  TRAIN_REQUIRE(o.lr * o.weight_decay < 1, "--weight-decay " << o.weight_decay << " at --lr " << o.lr
                                                             << ": the peak step would multiply every weight by 1 - lr x wd = "
                                                             << 1 - o.lr * o.weight_decay << " (lr x wd must stay below 1)");
  TRAIN_REQUIRE(o.draft_attention == "llama" || o.draft_attention == "mla",
                "--draft-attention '" << o.draft_attention << "' is not llama or mla");
  TRAIN_REQUIRE(o.lm_head_init == "target" || o.lm_head_init == "random",
                "--lm-head-init '" << o.lm_head_init << "' is not target or random");
  TRAIN_REQUIRE(o.loss_normalization == "valid" || o.loss_normalization == "all",
                "--loss-normalization '" << o.loss_normalization << "' is not valid or all");
  TRAIN_REQUIRE(o.heldout_samples >= 0, "--heldout-samples must be >= 0, got " << o.heldout_samples);
  TRAIN_REQUIRE(o.draft_sliding_window >= 0,
                "--draft-sliding-window must be >= 0 (0: none), got " << o.draft_sliding_window);
  if (o.draft_sliding_window > 0 && !o.model_dir.empty() && fs::is_regular_file(fs::path(o.model_dir) / "config.json")) {
    // A window as long as any position never applies (and would still cost the draft SGLang).
    const TargetConfig t = load_model_option("train", "model", o.model_dir);
    TRAIN_REQUIRE(t.max_position_embeddings <= 0 || o.draft_sliding_window < t.max_position_embeddings,
                  "--draft-sliding-window " << o.draft_sliding_window << " is not below --model " << o.model_dir
                                            << "'s max_position_embeddings " << t.max_position_embeddings
                                            << ", so it would never apply; use 0 for no window");
  }
  TRAIN_REQUIRE(!(o.draft_fc_norm && o.draft_norm_before_fc),
                "--draft-fc-norm (one norm per aux chunk) and --draft-norm-before-fc (one norm over the "
                "concatenation) are both given; choose one (speculators refuses a draft with both)");
  if (o.draft_attention == "mla") {
    // The target first: on a target without MLA the options below are beside the point.
    const TargetConfig t = load_model_option("train", "model", o.model_dir);
    TRAIN_REQUIRE(t.mla.enabled(), "--draft-attention mla: --model " << o.model_dir << " ("
                                       << "model_type " << t.model_type << ") has no multi-head latent attention (no kv_lora_rank in its "
                                          "config.json); use --draft-attention llama");
    TRAIN_REQUIRE(o.draft_sliding_window == 0 && !o.draft_sliding_window_auto,
                  "--draft-sliding-window goes with the Llama draft only: vLLM's Eagle3DeepseekV2ForCausalLM, which "
                  "serves the MLA draft, reads no sliding window");
    // vLLM's Eagle3DeepseekV2ForCausalLM (deepseek_eagle3.py), the layer the MLA draft exports to, has
    // fc(f) without input_norm and hands the pre-norm hidden on (no norm_output): a draft trained with
    // either would be served as another draft.
    TRAIN_REQUIRE(!o.draft_fc_norm, "--draft-fc-norm goes with the Llama draft only: vLLM's "
                                    "Eagle3DeepseekV2ForCausalLM, which serves the MLA draft, has fc(f) without norms");
    TRAIN_REQUIRE(!o.draft_norm_before_fc && !o.draft_norm_output,
                  "--draft-attention mla takes --draft-norm-before-residual only of the EAGLE-3.1 options: vLLM's "
                  "Eagle3DeepseekV2ForCausalLM, which serves the MLA draft, has no input_norm (--draft-norm-before-fc) "
                  "and always hands the pre-norm hidden state on (no --draft-norm-output)");
    TRAIN_REQUIRE(o.draft_heads == 0 && o.draft_kv_heads == 0 && o.draft_head_dim == 0,
                  "--draft-heads, --draft-kv-heads and --draft-head-dim shape the Llama draft's attention; "
                  "--draft-attention mla takes the target's heads, LoRA ranks and head dims");
  }
  TRAIN_REQUIRE(o.device == "auto" || o.device == "cpu" || o.device == "cuda",
          "--device '" << o.device << "' is not auto, cpu or cuda");
  TRAIN_REQUIRE(o.precision == "auto" || o.precision == "bf16" || o.precision == "f32",
          "--precision '" << o.precision << "' is not auto, bf16 or f32");
  if (!o.prepared_path.empty()) {  // streaming: the prepared file instead of the shards
    try {
      const PreparedFile prepared(o.prepared_path);
      AERIE_CHECK(prepared.num_samples() > 0, "it holds no sample");
    } catch (const Error& e) {
      AERIE_THROW("train: --prepared " << o.prepared_path << " is not a prepared file of aerie prepare: " << e.what());
    }
  } else {
  AERIE_CHECK(fs::is_directory(o.shards_dir), "train: --shards " << o.shards_dir
                                                  << (fs::exists(o.shards_dir) ? " is not a folder" : ": no such folder")
                                                  << " (the --output folder of aerie extract)");
  AERIE_CHECK(!list_shards(o.shards_dir).empty(),
              "train: --shards " << o.shards_dir << " holds no shard-*.h5 files (the --output folder of aerie extract)");
  }
  AERIE_CHECK(!fs::exists(o.output_dir) || fs::is_directory(o.output_dir),
              "train: --output " << o.output_dir << " exists and is not a folder");
  // A shard folder given as the run folder (or the reverse, in extract) would mix the two.
  AERIE_CHECK(!fs::is_directory(o.output_dir) || list_shards(o.output_dir).empty(),
              "train: --output " << o.output_dir << " holds hidden-state shards (shard-*.h5): it is an extract "
                                 << "folder, not a run folder; choose another --output");
  // A model's folder or a draft export (config.json, model*.safetensors) given as the run folder would hold
  // both: eval --draft would read the export, export --checkpoint the run.
  AERIE_CHECK(!fs::is_directory(o.output_dir) || !fs::exists(fs::path(o.output_dir) / "config.json"),
              "train: --output " << o.output_dir << " holds config.json (a model's folder or a draft export of "
                                 << "aerie export), not a run folder; choose another --output");
  if (!latest_checkpoint(o.output_dir)) {  // a fresh run (a resume keeps the checkpoint's vocabulary)
    AERIE_CHECK(!o.vocab_path.empty(), "train: --vocab is required for a fresh run (no checkpoint in --output "
                                           << o.output_dir << "): the draft_vocab.safetensors of aerie vocab");
    AERIE_CHECK(fs::is_regular_file(o.vocab_path),
                "train: --vocab " << o.vocab_path << (fs::exists(o.vocab_path) ? " is not a file" : ": no such file"));
    try {
      load_draft_vocab(o.vocab_path);  // small: d2t [K] and t2d [V]
    } catch (const Error& e) {
      AERIE_THROW("train: --vocab " << o.vocab_path << " is not a draft vocabulary of aerie vocab: " << e.what());
    }
  }
  // Last, as in eval: a missing model folder, or a draft export given as the target, named with the option.
  load_model_option("train", "model", o.model_dir);
}


// The command line of `aerie train`: TrainOptions and the values that are not its own.
struct TrainArgs {
  TrainOptions o;
  std::string target_model, aux_layers, target_dtype, sliding_window = "0";
  int target_ranks = 1, tp = 0;
  int64_t batch_tokens = 2048;
};

// The options of the inputs, the streaming target and the recipe's AdamW and loss (--help lists them first).
void add_input_options(po::options_description& desc, TrainArgs& a) {
  TrainOptions& o = a.o;
  std::string &target_model = a.target_model, &aux_layers = a.aux_layers, &target_dtype = a.target_dtype;
  int &target_ranks = a.target_ranks, &tp = a.tp;
  int64_t& batch_tokens = a.batch_tokens;
  desc.add_options()("model", po::value<std::string>(&o.model_dir)->default_value(""),
                     "target model directory (config.json, model.safetensors): the draft's embedding and lm_head "
                     "(default with --prepared: --target-model)")(
      "shards", po::value<std::string>(&o.shards_dir)->default_value(""),
      "folder of shard-*.h5 files from aerie extract (or --prepared: streaming)")(
      "prepared", po::value<std::string>(&o.prepared_path)->default_value(""),
      "streaming: prepared.h5 of aerie prepare; the first --target-ranks ranks run --target-model over it and "
      "send the hidden states to the other ranks, which train (no shards)")(
      "target-model", po::value<std::string>(&target_model)->default_value(""),
      "streaming: the target the target ranks run (default: --model)")(
      "target-ranks", po::value<int>(&target_ranks)->default_value(1),
      "streaming: world ranks 0 .. N-1 run the target, the rest train the draft")(
      "tp", po::value<int>(&tp)->default_value(0),
      "streaming: tensor-parallel ranks per target replica, dividing --target-ranks (0: all of them, one replica)")(
      "aux-layers", po::value<std::string>(&aux_layers)->default_value(""),
      "3 ascending layer ids k, 'input of decoder layer k', as extract's; streaming: the ones the target computes "
      "(default 2,N/2,N-3); offline: the shards must hold these (default: any)")(
      "batch-tokens", po::value<int64_t>(&batch_tokens)->default_value(2048),
      "streaming, target on a GPU (or --tp-overlap at --tp 2 or more): consecutive samples of a step share one "
      "forward up to this many tokens (0: one sample per forward)")(
      "target-dtype", po::value<std::string>(&target_dtype)->default_value("auto"),
      "streaming: the target's compute dtype: auto (bf16 on cuda, f32 on cpu), f32 or bf16")(
      "expert-parallel", po::bool_switch(),
      "streaming, MoE targets: split the routed experts over the --tp ranks by expert (as extract's)")(
      "fp8-gemm", po::bool_switch(),
      "streaming: the target's linears as W8A8 block-FP8 GEMMs (as extract --fp8-gemm)")(
      "tp-overlap", po::bool_switch(),
      "streaming, --tp 2 or more: the target's all-reduces overlapped with compute (as extract --tp-overlap)")(
      "adam-beta1", po::value<double>(&o.adam_beta1)->default_value(0.9, "0.9"), "AdamW beta1")(
      "adam-beta2", po::value<double>(&o.adam_beta2)->default_value(0.999, "0.999"),
      "AdamW beta2 (torch's default and SpecForge's; docs/design.md). Not given, a "
      "resumed run takes its checkpoint's beta2; given and different from it, the resume is refused")(
      "weight-decay", po::value<double>(&o.weight_decay)->default_value(0.0, "0"),
      "AdamW's decoupled weight decay of every trained weight, norms included (torch's AdamW with one parameter "
      "group; 0 as in EAGLE and SpecForge). A resumed run must be given its checkpoint's value (refused otherwise)")(
      "lm-head-init", po::value<std::string>(&o.lm_head_init)->default_value("target"),
      "the draft's lm_head at step 0: target (the target's rows of the draft vocabulary) or random (nn.Linear's "
      "init, as SpecForge)")(
      "loss-normalization", po::value<std::string>(&o.loss_normalization)->default_value("valid"),
      "each TTT step's loss divided by its trained rows (valid, eagle3.md) or by all rows of the global batch "
      "(all, SpecForge's mean over positions)");
}

// The options of the run (steps, schedule, checkpoints, warm start, device) and of the draft's shape.
void add_run_options(po::options_description& desc, TrainArgs& a) {
  TrainOptions& o = a.o;
  std::string& sliding_window = a.sliding_window;
  desc.add_options()(
      "stream-queue", po::value<int64_t>(&o.stream_queue)->default_value(2),
      "streaming: steps the target may compute ahead of the step being trained (bounds the messages in flight)")(
      "vocab", po::value<std::string>(&o.vocab_path)->default_value(""),
      "draft_vocab.safetensors from aerie vocab (required unless resuming)")(
      "output", po::value<std::string>(&o.output_dir)->required(), "run folder (checkpoints/, metrics.jsonl)")(
      "steps", po::value<int64_t>(&o.steps)->default_value(0), "total optimizer steps (0: --epochs)")(
      "epochs", po::value<int64_t>(&o.epochs)->default_value(1), "epochs, when --steps is 0")(
      "batch-size", po::value<int64_t>(&o.batch_size)->default_value(8), "samples per global step")(
      "lr", po::value<double>(&o.lr)->default_value(1e-4, "1e-4"), "peak learning rate")(
      "warmup-ratio", po::value<double>(&o.warmup_ratio)->default_value(0.015, "0.015"), "linear warmup, fraction of the steps")(
      "max-grad-norm", po::value<double>(&o.max_grad_norm)->default_value(0.5), "global gradient norm clip (0: off)")(
      "ttt-steps", po::value<int>(&o.ttt_steps)->default_value(7), "training-time test steps S")(
      "checkpoint-every", po::value<int64_t>(&o.checkpoint_every)->default_value(0),
      "steps between checkpoints (0: only at the end)")(
      "keep-checkpoints", po::value<int>(&o.keep_checkpoints)->default_value(0),
      "keep only the newest N complete checkpoints (0: all)")(
      "log-every", po::value<int64_t>(&o.log_every)->default_value(10), "steps between metric lines")(
      "seed", po::value<uint64_t>(&o.seed)->default_value(0), "seed of the initial weights and the data order")(
      "eval-fraction", po::value<double>(&o.eval_fraction)->default_value(0.05, "0.05"),
      "fraction of the samples (the last ones) held out for eval")(
      "heldout-samples", po::value<int64_t>(&o.heldout_samples)->default_value(64),
      "held-out samples scored at each checkpoint (acc_k, tau_sim in heldout.jsonl and TensorBoard; 0: none)")(
      "init-draft", po::value<std::string>(&o.init_draft)->default_value(""),
      "warm start: a checkpoint folder, or a run folder (its newest complete checkpoint), whose draft weights a "
      "fresh run starts from (same draft options and --vocab; new optimizer state and schedule). E.g. more "
      "steps or new data for a finished run, into another --output. A resume ignores it")(
      "device", po::value<std::string>(&o.device)->default_value("auto"),
      "auto (cuda when every rank of the node has a GPU), cpu or cuda (one GPU per rank: local rank % GPUs)")(
      "precision", po::value<std::string>(&o.precision)->default_value("auto"),
      "auto (bf16 on cuda, f32 on cpu), bf16 (fp32 master weights, bf16 GEMM inputs) or f32")(
      "draft-heads", po::value<int64_t>(&o.draft_heads)->default_value(0),
      "the draft's attention heads (0: the target's; e.g. 56 for SpecForge's DeepSeek-V3 draft)")(
      "draft-kv-heads", po::value<int64_t>(&o.draft_kv_heads)->default_value(0),
      "the draft's kv heads, dividing --draft-heads (0: the target's, at most --draft-heads)")(
      "draft-head-dim", po::value<int64_t>(&o.draft_head_dim)->default_value(0),
      "the draft's head dim, even (0: the target's; an MLA target's v_head_dim)")(
      "draft-intermediate", po::value<int64_t>(&o.draft_intermediate)->default_value(0),
      "the draft's MLP width (0: the target's intermediate_size)")(
      "draft-attention", po::value<std::string>(&o.draft_attention)->default_value("llama"),
      "the draft layer's attention: llama (the original EAGLE-3 layer) or mla (DeepSeek-V3 / Kimi targets: "
      "multi-head latent attention with the target's ranks and head dims, exported for vLLM's "
      "Eagle3DeepseekV2ForCausalLM)")(
      "draft-norm-before-residual",
      po::value<bool>(&o.draft_norm_before_residual)->default_value(true)->implicit_value(true),
      "EAGLE-3.1's norm_before_residual: the draft layer's residual is hidden_norm(h), not h (exported as "
      "config.norm_before_residual, which vLLM and speculators read; SGLang's Llama draft has no such option: "
      "train for SGLang with --draft-norm-before-residual=false, the original EAGLE-3 layout; default on, "
      "speculators' default, +3.4% acceptance on SmolLM2 and +5.7% on the demo, docs/design.md; a resumed run "
      "keeps its checkpoint's setting unless this is given)")(
      "draft-norm-output", po::value<bool>(&o.draft_norm_output)->default_value(false)->implicit_value(true),
      "EAGLE-3.1's norm_output: each draft step hands norm(o), the lm_head's input, to the next instead of "
      "the layer output o (exported as config.norm_output, which vLLM, SGLang and speculators read; "
      "default: the original EAGLE-3 chain)")(
      "draft-norm-before-fc", po::value<bool>(&o.draft_norm_before_fc)->default_value(false)->implicit_value(true),
      "EAGLE-3.1's norm_before_fc: one RMSNorm with a trained weight (input_norm, [3 H_t], initialised to "
      "ones) over the concatenated aux hidden states before fc (exported as config.norm_before_fc and "
      "input_norm.weight, which vLLM, SGLang and speculators read; default: the original EAGLE-3 fc(f))")(
      "draft-fc-norm", po::value<bool>(&o.draft_fc_norm)->default_value(false)->implicit_value(true),
      "EAGLE-3.1's per-chunk norms: one RMSNorm with a trained weight (fc_norm.k, [H_t], initialised to ones) "
      "over each of the three aux hidden states before fc (exported as config.fc_norm and fc_norm.{0,1,2}.weight, "
      "which SpecForge and speculators read; not with --draft-norm-before-fc; a resume option: give it again when "
      "resuming; default: the original EAGLE-3 fc(f))")(
      "draft-sliding-window", po::value<std::string>(&sliding_window)->default_value("0"),
      "a sliding window for the draft's attention, in keys: each position sees the last N step-0 keys and "
      "its own TTT keys (speculators trains with 2048; exported as config.layer_types [\"sliding_attention\"] "
      "and config.sliding_window, which vLLM reads; SGLang does not; below the target's max_position_embeddings; "
      "auto: the power of two at or above the 90th percentile of the training samples' lengths, for serving "
      "prompts longer than them; 0: none, the original EAGLE-3 layer; a resume option: give it again when "
      "resuming)")(
      "allow-missing-shards", po::bool_switch(&o.allow_missing_shards),
      "train on a shard folder that lacks some chunks of its extraction (default: refused)")(
      "allow-other-target", po::bool_switch(&o.allow_other_target),
      "train on shards (or resume a checkpoint) whose recorded target fingerprint differs from --model's "
      "(default: refused)");
}

// The options of the mode: streaming (--prepared: --target-model, --tp, ...) or offline (--shards, none of
// the streaming ones). Usage errors (exit 2); a --target-model without config.json: aerie::Error.
void check_mode_options(TrainArgs& a, const po::variables_map& vm, bool streaming) {
  TrainOptions& o = a.o;
  std::string &target_model = a.target_model, &target_dtype = a.target_dtype;
  const int tp = a.tp;
  const int64_t batch_tokens = a.batch_tokens;
  if (streaming) {
    TRAIN_REQUIRE(o.shards_dir.empty(), "--shards and --prepared exclude each other (--prepared streams the hidden "
                                        "states from the target instead of reading shards)");
    if (target_model.empty()) target_model = o.model_dir;
    if (o.model_dir.empty()) o.model_dir = target_model;
    TRAIN_REQUIRE(!o.model_dir.empty(), "--prepared needs --target-model (or --model)");
    TRAIN_REQUIRE(o.stream_queue >= 0, "--stream-queue must be >= 0, got " << o.stream_queue);
    TRAIN_REQUIRE(batch_tokens >= 0, "--batch-tokens " << batch_tokens << " is negative (0: one sample per forward)");
    TRAIN_REQUIRE(tp >= 0, "--tp must be >= 0 (0: --target-ranks), got " << tp);
    TRAIN_REQUIRE(target_dtype == "auto" || target_dtype == "f32" || target_dtype == "bf16",
                  "--target-dtype '" << target_dtype << "' is not auto, f32 or bf16");
    AERIE_CHECK(fs::is_regular_file(fs::path(target_model) / "config.json"),
                "train: --target-model " << target_model << " holds no config.json (a model folder in the Hugging Face "
                                         << "layout, as extract's --model)");
    o.target_model_dir = target_model;
  } else {
    TRAIN_REQUIRE(!o.model_dir.empty(), "--model is required");
    TRAIN_REQUIRE(!o.shards_dir.empty(), "--shards (the folder of aerie extract) or --prepared (streaming) is required");
    for (const char* opt : {"target-model", "target-ranks", "tp", "batch-tokens", "target-dtype", "expert-parallel",
                            "fp8-gemm", "tp-overlap", "stream-queue"})
      TRAIN_REQUIRE(vm[opt].defaulted(), "--" << opt << " applies to streaming only (with --prepared); this run "
                                              << "reads --shards");
  }
}

// --draft-sliding-window: a number of keys, or auto (from the training samples' lengths).
void parse_sliding_window(TrainArgs& a) {
  TrainOptions& o = a.o;
  const std::string& sliding_window = a.sliding_window;
  std::string window_word = trim_blanks(sliding_window);
  std::transform(window_word.begin(), window_word.end(), window_word.begin(),
                 [](unsigned char ch) { return static_cast<char>(std::tolower(ch)); });
  if (window_word == "auto") {
    o.draft_sliding_window_auto = true;
  } else {
    const std::optional<int64_t> w = parse_int64(sliding_window);
    TRAIN_REQUIRE(w.has_value(), "--draft-sliding-window '" << sliding_window << "' is not a number of keys or auto");
    o.draft_sliding_window = *w;
  }
}

// Offline: every rank trains on the shards.
int train_offline(TrainArgs& a, const po::variables_map& vm, MpiCommunicator& world) {
  TrainOptions& o = a.o;
  const std::string& aux_layers = a.aux_layers;
  // Checked against the shards' (1000 layers: any 3 ascending ids parse; the shards name the real ones).
  if (!aux_layers.empty()) o.aux_layers = parse_aux_layers(aux_layers, 1000, "train");
  // Before the target's head loads: a second train into this run folder is refused at once (rank 0,
  // which writes the checkpoints and metrics, holds the lock until the job ends).
  const OutputLock lock = lock_output(vm, "train", o.output_dir, LockTarget::Folder);
  const TrainResult r = run_training(o, world);
  if (r.stop_signal != 0) return kPreemptedExitCode;
  if (world.rank() == 0) AERIE_LOG(info) << "train: done, final checkpoint " << r.checkpoint;
  return 0;
}

// Streaming, a target rank: the prepared file checked, the target loaded, the trainers served.
int serve_target(const TrainArgs& a, const po::variables_map& vm, MpiCommunicator& world, const StreamLayout& layout,
                 MpiCommunicator& side, const TargetConfig& tcfg, const std::vector<int>& aux) {
  StreamTargetJob job;
  job.prepared_path = a.o.prepared_path;
  job.target_model = a.target_model;
  job.aux_layers = aux;
  job.aux_layers_default = a.aux_layers.empty();
  job.batch_tokens = a.batch_tokens;
  job.batch_size = a.o.batch_size;
  check_stream_prepared(job, tcfg, world.rank() == 0);
  ParallelGroups groups = ParallelGroups::create(layout.tp, side);
  TargetDevice td = resolve_target_device(a.o.device, a.target_dtype, vm["expert-parallel"].as<bool>(), groups,
                                          "train (target)", node_size(side));
  td.options.fp8_gemm = vm["fp8-gemm"].as<bool>();  // the trainer ranks record it: o.stream_target_gemm
  td.options.tp_overlap = vm["tp-overlap"].as<bool>();
  TargetModel model(a.target_model, *td.tp, td.options);
  const StreamTargetStats st = serve_stream_target(world, layout, *groups.tp, model, td.options, tcfg, job);
  if (td.options.device == Device::CUDA) log_gpu_memory("train (target)", world.rank());
  return st.stop_signal != 0 ? kPreemptedExitCode : 0;
}

// Streaming: world ranks 0 .. --target-ranks - 1 run the target, the others train (train/stream.h).
int train_streaming(TrainArgs& a, const po::variables_map& vm, MpiCommunicator& world) {
  TrainOptions& o = a.o;
  const std::string &target_model = a.target_model, &aux_layers = a.aux_layers;
  const int target_ranks = a.target_ranks, tp = a.tp;
  // Every rank checks the same layout: a bad one is a usage error on all of them (exit 2, no MPI_Abort).
  const StreamLayout layout = [&] {
    try {
      return StreamLayout(world.size(), target_ranks, tp > 0 ? tp : target_ranks);
    } catch (const UsageError&) {
      throw;
    } catch (const Error& e) {
      throw UsageError(std::string("aerie ") + e.what());
    }
  }();
  const bool is_target = layout.is_target(world.rank());
  if (vm["fp8-gemm"].as<bool>()) o.stream_target_gemm = fp8_gemm_tag(layout.tp);
  local_rank();  // collective over the world on first use: every rank makes it here, before the sides part
  const TargetConfig tcfg = load_model_option("train", "target-model", target_model);
  const std::vector<int> aux = parse_aux_layers(aux_layers, tcfg.num_hidden_layers, "train");
  // The first training rank writes the run folder, so it holds the lock (a refusal reaches every rank).
  auto trainer_first = world.split(0, is_target ? world.rank() + world.size() : world.rank() - target_ranks);
  LockOptions lock_opts;
  lock_opts.force_unlock = vm["force-unlock"].as<bool>();
  const OutputLock lock = acquire_output_lock(trainer_first->handle(), o.output_dir, LockTarget::Folder, "train", lock_opts);
  auto side = world.split(is_target ? 0 : 1, world.rank());
  if (is_target) return serve_target(a, vm, world, layout, *side, tcfg, aux);

  StreamClient client(world, layout, o.prepared_path, aux);
  const TrainResult r = run_training(o, *side, &client);
  if (r.stop_signal != 0) return kPreemptedExitCode;  // stopped early, checkpoint written (logged): not a completed run
  if (side->rank() == 0) AERIE_LOG(info) << "train: done, final checkpoint " << r.checkpoint;
  return 0;
}

}  // namespace

int train(const std::vector<std::string>& args) {
  po::options_description desc = job_options("aerie train: train the EAGLE-3 draft with training-time test");
  TrainArgs a;
  add_input_options(desc, a);
  add_run_options(desc, a);
  add_lock_options(desc);
  po::variables_map vm;
  if (!parse_options("train", args, desc, vm)) return 0;
  TrainOptions& o = a.o;
  const bool streaming = !o.prepared_path.empty();
  check_mode_options(a, vm, streaming);
  parse_sliding_window(a);
  o.draft_norm_before_residual_given = !vm["draft-norm-before-residual"].defaulted();
  o.adam_beta2_given = !vm["adam-beta2"].defaulted();
  o.weight_decay += 0.0;  // -0 is recorded as 0 (-0 + 0 is +0)
  check_train_inputs(o);
  auto world = MpiCommunicator::world();
  return streaming ? train_streaming(a, vm, *world) : train_offline(a, vm, *world);
}

}  // namespace aerie::jobs
