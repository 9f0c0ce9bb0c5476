// The hours and bytes of aerie's jobs, predicted from a calibration: what `aerie calibrate` measured on the user's
// own node (the target's forward by layer kind with random weights, the draft's training step, the shard writer's
// disk throughput, the tp group's all-reduce), and a dataset's description. The arithmetic and its assumptions:
// docs/time-plan.md. Pure functions: tested on the CPU without a device.
#pragma once
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace aerie {

/// One measured curve: seconds at each token count (ascending, >= 1 point).
struct TimeCurve {
  std::vector<int64_t> tokens;
  std::vector<double> seconds;
  /// Seconds at `t` tokens: between two measured points the power law through them (where both are positive and
  /// the later larger; else the straight line); beyond them along the nearest segment's (one point: proportional to
  /// t), except below the first point where the first segment grows no faster than the tokens: its straight line
  /// (a fixed cost stays); never below 0. Throws aerie::Error when the curve is empty or t < 0.
  double at(double t) const;

  /// seconds ~ fixed + linear x t + quadratic x t^2: a forward's fixed cost (launches, set-up), its work per token,
  /// and attention's growth with the sequence's length.
  struct Fit {
    double fixed = 0, linear = 0, quadratic = 0;
    /// A forward of samples packed into `rows` tokens whose squared lengths sum to `sum_sq` (each sample attends
    /// within itself): fixed + linear x rows + quadratic x sum_sq seconds.
    double packed(double rows, double sum_sq) const { return fixed + linear * rows + quadratic * sum_sq; }
  };
  /// The least-squares fit of the points by relative error, every coefficient >= 0, with at most as many terms as
  /// points (two points: fixed + linear where the growth is at most linear, else linear + quadratic; one point:
  /// linear). Throws aerie::Error when the curve is empty.
  Fit fit() const;
};

/// The seconds of one layer kind of the target ("dense", "moe") per forward, and how many the target has.
struct LayerKindTimes {
  std::string kind;
  int64_t count = 0;
  TimeCurve curve;
};

/// What `aerie calibrate` measured, as stored in calibration.json ("aerie.calibration" v1, docs/time-plan.md).
struct Calibration {
  std::string device;  // "cpu", or the GPU's name
  std::string model;   // the target's config.json
  /// What of the target the times depend on beyond its hidden size and layer kinds (jobs/plan_time.h
  /// calibration_target: vocabulary, widths, heads, experts, weight format), for plan to compare; "" in an older file.
  std::string target;
  int world = 1;       // ranks of the calibration run
  int tp = 1;          // ranks of the tp group that ran the forward
  int cpu_cores = 0;   // the fewest CPU cores a rank of the calibration could run on (its affinity; 0 in an older file)
  int64_t hidden_size = 0;
  bool tp_overlap = false;            // the forward ran with --tp-overlap: two micro-batches of T/2 (false in an older file)
  int expert_parallel = -1;           // 1 / 0: the forward ran with / without --expert-parallel; -1: not recorded
  TimeCurve base;                     // a forward's cost outside the layers (embedding, final norm, captures)
  std::vector<LayerKindTimes> layers; // each kind's seconds per layer per forward
  TimeCurve train_sample;             // the draft's training step over one sample of the given length (TTT steps)
  TimeCurve train_sample_alone;       // the same on one rank while the others idle (empty: one rank, or not measured)
  double train_step_seconds = 0;      // of train_sample, what a step pays once whatever its samples (AdamW, ...)
  int64_t train_batch = 0;            // samples of the measured steps (train_sample: its step's own cost + one B-th
                                      // of the rest; 0 in an older file: steps of one sample)
  int ttt_steps = 0;
  int64_t draft_vocab_size = 0;       // the draft vocabulary of the measured step (0: an older aerie's, not recorded)
  TimeCurve writer_sample;            // the shard writer's work per sample (rounding, checks, HDF5) by its length
  double disk_write_bytes_per_s = 0;  // shards written by every tp group at once (the node's aggregate)
  int64_t disk_test_bytes = 0;
  double allreduce_bus_bytes_per_s = 0;  // the tp group's all-reduce of [T, H] bf16 (0 at tp 1)
  /// calibrate --model-tp: one rank of the tp group ran the forward and generate here, their all-reduces modeled
  /// (ModeledCommunicator) at allreduce_bus_bytes_per_s and allreduce_latency_s each, as the user gave them for
  /// the planned node (false and 0 in an older file: measured).
  bool tp_modeled = false;
  double allreduce_latency_s = 0;
  /// extract's own work beside its forwards and its writer (the chunk hand-out, reading the prepared file, the
  /// outputs' copies and checks, opening and closing the shard), per run and per sample of one tp group: what two
  /// short runs of extract's loop took beyond extract_compute_seconds' arithmetic (0 in an older file).
  double extract_run_seconds = 0, extract_sample_seconds = 0;
  /// aerie generate's decoding of the whole target on one tp group: `batch` sequences of `prompt_tokens` random
  /// ids decoding `new_tokens` each (BatchDecoder, prefills included), in `seconds` (0: not measured), and the same
  /// sequences decoding one token each in `first_seconds` (their prefills; 0 in an older file).
  struct Generation {
    int64_t batch = 0, prompt_tokens = 0, new_tokens = 0;
    double seconds = 0, first_seconds = 0;
  } generate;
  /// One rank's MPI messages to another, as the streaming train sends a sample's hidden states (bytes/s; 0: not
  /// measured, a calibration of one rank or of an older aerie).
  double stream_bytes_per_s = 0;

  /// A forward of the whole target over `t` tokens, per tp group: base + sum of count x layer seconds.
  double forward_seconds(double t) const;
  /// The whole target's forward of several packed samples (extract's and the streaming target's forwards, each
  /// sample attending within itself; Fit::packed), per tp group: base's fit + sum of count x each layer kind's fit
  /// (TimeCurve::fit). With tp_overlap the curves are of two sequences of T/2, whose attention term is half a
  /// sequence of T's: the quadratic term doubled.
  TimeCurve::Fit packed_forward_fit() const;
};

/// calibration.json's content, and back. calibration_from_json throws aerie::Error naming `path` and the field when
/// the format, version or a field is wrong.
nlohmann::json to_json(const Calibration& c);
Calibration calibration_from_json(const nlohmann::json& j, const std::string& path);

/// The dataset and layout a prediction is for.
struct Workload {
  int64_t samples = 0;
  double mean_tokens = 0;      // tokens per sample (prompt + answer)
  /// Each sample's tokens (a prepared file's), when known: the forward's and the step's costs grow faster than
  /// linearly with a sample's length, so a spread of lengths costs more than `samples` of the mean.
  std::vector<int64_t> lengths;
  /// `lengths` as a prepared file's sample offsets [N + 1] (0, then their running sums): what the jobs' packing
  /// (data/extract.h's packed_forward_end) reads.
  std::vector<int64_t> offsets() const;
  int64_t batch_tokens = 2048; // extract --batch-tokens: samples packed into forwards of about this many (0: one each)
  int64_t samples_per_shard = 64;  // extract --samples-per-shard: the chunk rank 0 hands a tp group at a time
  int world = 1, tp = 1;       // the job's ranks and tp group size (dp = world / tp)
  int epochs = 1;              // train: passes over the samples ...
  int64_t train_samples = 0;   // ... or, > 0, the samples its steps draw (train --steps x --batch-size)
  int64_t train_batch_size = 8; // train --batch-size (a step's samples: the streaming queue's unit)
  bool fp8_storage = false;    // extract --storage fp8: shards of e4m3 codes and per-vector scales
  /// > 0: also the streaming train (train --prepared --target-ranks N): world ranks 0 .. N-1 run the target in N / tp
  /// replicas, the other world - N ranks train the draft.
  int stream_target_ranks = 0;
  /// The streaming train's target and trainer ranks share devices (one GPU for both, or more ranks than cores):
  /// their compute adds up instead of overlapping.
  bool stream_colocated = false;
  /// The devices the ranks run on: `world`, or with stream_colocated max(stream_target_ranks, world -
  /// stream_target_ranks) (a trainer rank beside each target rank: --world 16 --stream-target-ranks 8 is 8 GPUs).
  /// generate, extract and the offline train run on this many ranks, one a device, and the costs count them.
  int devices() const {
    return stream_colocated ? std::max(stream_target_ranks, world - stream_target_ranks) : world;
  }
  /// > 0: also generate (regenerating the answers): this many responses of gen_new_tokens new tokens each after
  /// prompts of gen_prompt_tokens (means), decoded gen_batch at a time (generate --batch-size) per tp group.
  int64_t gen_responses = 0;
  double gen_prompt_tokens = 0, gen_new_tokens = 0;
};

/// One job's prediction.
struct JobTime {
  std::string job;       // "generate", "extract", "train", "train --prepared" (streaming)
  double seconds = 0;    // wall time
  double compute_seconds = 0, disk_seconds = 0;
  int64_t bytes = 0;     // what it writes (shards)
  std::string bound;     // "compute" or "disk"; streaming: "target", "draft" or "messages"
  /// Streaming only: the target replicas' forwards, the trainers' steps and the messages' transfer (seconds
  /// each, per side), and the hidden states one replica leader holds queued (bytes, train --stream-queue 2).
  double target_seconds = 0, draft_seconds = 0, message_seconds = 0;
  int64_t queue_bytes = 0;
};

/// generate (with `w.gen_responses`: the prefills as forwards of the prompts, the decoding at the measured run's
/// seconds per new token), extract and train (offline, over extract's shards) for `w` from `c`, and with
/// `w.stream_target_ranks` the streaming train (its target side costed as extract's forwards of the samples drawn,
/// its messages 8 H bytes per token at the calibration's stream rate, one link per replica-trainer pair; its wall
/// time the longest side, or the target's and the draft's sum where they share devices). With `w.lengths` each sample
/// is costed at its own length (a forward of one sample where batch_tokens is 0, else the samples packed into
/// forwards of up to batch_tokens as the jobs pack them, Calibration::packed_forward_fit), else every sample at the
/// mean. Where world % tp != 0 only the streamed train (whose target ranks alone form tp groups). Throws aerie::Error
/// when the workload is empty, its tp differs from the calibration's (the forward was measured at that tp), world %
/// tp != 0 without a streamed train, or the streaming split leaves no trainer or is not a multiple of tp.
std::vector<JobTime> plan_time(const Calibration& c, const Workload& w);

/// extract's compute on `w.world / w.tp` tp groups: the target's forwards of every sample (each chunk of
/// samples_per_shard packed into forwards of up to w.batch_tokens, or one per sample at 0) and the shard writer's
/// work per sample, the longer of the two where the writer's thread runs beside the forwards (batch_tokens > 0 on a
/// GPU), else their sum; the busiest group's share of it, chunks of samples_per_shard samples handed out in order to
/// the group free first, each costing its samples' share; plus c's extract_run_seconds and extract_sample_seconds per
/// sample of that group.
double extract_compute_seconds(const Calibration& c, const Workload& w);

}  // namespace aerie
