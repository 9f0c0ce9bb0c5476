// run_training: the `aerie train` run, top-down: the samples (shards or a stream), the run folder, a
// fresh start or resume, then a step loop whose body calls the things done once in a while (log, score
// the held-out samples, checkpoint), as llm.c's train_gpt2 main loop reads.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <iomanip>
#include <memory>
#include <sstream>

#include "comm/nccl_communicator.h"
#include "core/device.h"
#include "core/log.h"
#include "core/progress.h"
#include "core/stop_signals.h"
#include "io/fingerprint.h"
#include "model/target_config.h"
#include "train/checkpoint.h"
#include "train/data_order.h"
#include "train/eval.h"
#include "train/run_folder.h"
#include "train/run_start.h"
#include "train/sample_source.h"
#include "train/schedule.h"
#include "train/shard_set.h"
#include "train/target_head.h"
#include "train/trainer.h"

namespace aerie {

namespace {

// The signal received by any rank of `dp` (collective), 0 if none.
int any_stop_signal(Communicator& dp) { return max_over_ranks(dp, static_cast<int32_t>(StopSignals::received())); }

std::string join(const std::vector<double>& v, int precision) {
  std::ostringstream os;
  os.precision(precision);
  for (size_t i = 0; i < v.size(); ++i) os << (i ? " " : "") << v[i];
  return os.str();
}

// The samples' shards (streaming: the prepared file as one shard), checked against --model and --aux-layers.
ShardSet training_shards(const TrainOptions& opts, const TargetConfig& target, const TargetFingerprint& model_fp,
                         StreamClient* stream, int rank) {
  const std::string target_model = opts.target_model_dir.empty() ? opts.model_dir : opts.target_model_dir;
  const ShardSet shards =
      stream != nullptr
          ? streamed_set(*stream, target, target_model == opts.model_dir ? model_fp : TargetFingerprint::of_model(target_model),
                         target_model, opts.stream_target_gemm)
          : scan_shards(opts.shards_dir, target, opts, rank);
  check_shards_target(shards, model_fp, opts, rank);
  AERIE_CHECK(opts.aux_layers.empty() || opts.aux_layers == shards.aux_layers,
              "train: --aux-layers " << nlohmann::json(opts.aux_layers).dump() << ", but the shards in "
                                     << opts.shards_dir << " hold aux layers "
                                     << nlohmann::json(shards.aux_layers).dump()
                                     << " (extract --aux-layers): extract again or drop --aux-layers");
  return shards;
}

// The target's embedding and lm_head, frozen, on `dev` (uploaded once). On a GPU an lm_head stored in BF16 is held
// in BF16 (a tied one as a copy beside the F32 embedding): the targets' [T, H] x [H, V] GEMM (make_ttt_sample) runs
// in lm_head's dtype, and in FP32 it took as long as the draft's whole step (Kimi-K2.5's V 163840); the BF16 values
// are the stored ones and the shards' z is BF16, so only the order of the fp32 sums changes. Otherwise a tied
// lm_head stays one tensor with the embedding.
TargetHead load_head(const std::string& model_dir, const TargetConfig& target, Device dev) {
  TargetHead head = load_target_head(model_dir, target);
  if (dev != Device::CPU) {
    const bool tied = head.lm_head.raw() == head.embed_tokens.raw();
    const bool bf16 = head.lm_head_stored == DType::BF16;
    if (bf16) head.lm_head = head.lm_head.to(DType::BF16).to_device(dev);
    head.embed_tokens = head.embed_tokens.to_device(dev);
    if (!bf16) head.lm_head = tied ? head.embed_tokens : head.lm_head.to_device(dev);
  }
  return head;
}

// Streaming: the target's ranks learn the steps to compute (none when the run is complete).
void start_stream(StreamClient& stream, const TrainOptions& opts, const TrainState& st, int64_t total,
                  int64_t num_heldout, Communicator& dp) {
  StreamPlan plan;
  plan.start_step = st.step;
  plan.total_steps = total;
  plan.batch_size = opts.batch_size;
  plan.seed = opts.seed;
  plan.num_samples = st.split.num_samples();
  plan.num_train = static_cast<int64_t>(st.split.train.size());
  for (size_t i = 0; i < st.split.eval.size(); ++i)  // the held-out samples are the last ones (make_data_split)
    AERIE_CHECK(st.split.eval[i] == plan.num_train + static_cast<int64_t>(i),
                "train (stream): the split's held-out samples are not the last ones of " << opts.prepared_path);
  plan.num_heldout = num_heldout;
  plan.queue = opts.stream_queue;
  plan.trainers = dp.size();
  stream.start(plan, dp.rank());
}

// The steps of a run from its start (or resume) to the end or a stop signal, and what they do once in a
// while: log an interval, score the held-out samples, write a checkpoint. The weights and moments live on
// the run's device; `ck` keeps the host copies a checkpoint is written from.
class StepLoop {
 public:
  StepLoop(const TrainOptions& opts, Communicator& dp, Device dev, StreamClient* stream, const TargetHead& head,
           RunStart& start, BatchOrder& order, const LrSchedule& sched, int64_t total, int64_t num_heldout,
           RunFolder& folder, SampleSource& source, TrainResult& result);
  // Runs the steps until the last one or a stop signal (a checkpoint written either way), then finishes.
  void run();

 private:
  std::vector<TTTSample> load_samples(int64_t step, const std::vector<int64_t>& mine);
  void check_grad_norm(const StepMetrics& m, int64_t step, const std::vector<int64_t>& mine);
  void count_empty_step(const StepMetrics& m, int64_t step, const std::vector<int64_t>& mine);
  void maybe_log(int64_t step, double lr);
  bool maybe_checkpoint(int64_t step);  // true: stopped by a signal
  std::string save_checkpoint_now();
  void score_held_out();
  void finish();

  const TrainOptions& opts_;
  Communicator& dp_;
  const int rank_;
  const Device dev_;
  StreamClient* stream_;
  const TargetHead& head_;
  Checkpoint& ck_;
  TrainState& st_;
  std::string& vocab_file_;
  BatchOrder& order_;
  const LrSchedule& sched_;
  const int64_t total_, num_heldout_;
  bool heldout_logged_ = false;  // the first held-out line explains its figures
  RunFolder& folder_;
  SampleSource& source_;
  TrainResult& result_;
  // On a GPU the weights and moments live there for the whole run; on the CPU they share ck's storage.
  AdamState opt_;
  DraftWeights w_dev_;
  DraftWeights& w_;
  StepScratch scratch_;
  std::unique_ptr<NcclCommunicator> nccl_;  // gradients on GPUs are summed by NCCL (MPI keeps the counts)
  const std::vector<int64_t> selected_;
  StepRecipe recipe_;
  Progress progress_;
  // The current log interval.
  StepMetrics interval_;
  std::chrono::steady_clock::time_point t0_;
  int64_t steps_in_interval_ = 0;
  int64_t interval_skipped_ = 0;  // non-finite samples skipped in the interval (global)
  // The whole loop.
  int64_t steps_run_ = 0, empty_steps_ = 0;  // empty: no TTT row of step 0 in the whole global batch
  int64_t skipped_local_ = 0;                // non-finite samples skipped (this rank)
  double total_data_wait_ = 0;               // seconds this rank's loop waited for shard reads (rank 0's is logged)
  // Where the loop's time went on this rank: the samples made ready (read, targets made, sent to the device) and
  // train_step (forward, backward, all-reduce, update; both end on a host read, so the device is done).
  double load_seconds_ = 0, step_seconds_ = 0;
  double take_seconds_ = 0, targets_seconds_ = 0;  // parts of load_seconds_ (targets: and the copies to the device)
  std::chrono::steady_clock::time_point loop_start_;
};

std::unique_ptr<NcclCommunicator> gradient_comm(Device dev, Communicator& dp) {
  if (dev != Device::CUDA || dp.size() <= 1) return nullptr;
  auto* mpi = dynamic_cast<MpiCommunicator*>(&dp);
  AERIE_CHECK(mpi != nullptr, "train: --device cuda with several ranks needs an MPI communicator for NCCL");
  return std::make_unique<NcclCommunicator>(*mpi);
}

StepRecipe step_recipe(const TrainOptions& opts) {
  StepRecipe recipe;
  recipe.adam_beta1 = opts.adam_beta1;
  recipe.adam_beta2 = opts.adam_beta2;
  recipe.weight_decay = opts.weight_decay;
  recipe.normalize_by_all_rows = opts.loss_normalization == "all";
  return recipe;
}

StepLoop::StepLoop(const TrainOptions& opts, Communicator& dp, Device dev, StreamClient* stream,
                   const TargetHead& head, RunStart& start, BatchOrder& order, const LrSchedule& sched,
                   int64_t total, int64_t num_heldout, RunFolder& folder, SampleSource& source, TrainResult& result)
    : opts_(opts),
      dp_(dp),
      rank_(dp.rank()),
      dev_(dev),
      stream_(stream),
      head_(head),
      ck_(start.ck),
      st_(start.ck.state),
      vocab_file_(start.vocab_file),
      order_(order),
      sched_(sched),
      total_(total),
      num_heldout_(num_heldout),
      folder_(folder),
      source_(source),
      result_(result),
      opt_(dev == Device::CPU ? AdamState{std::move(ck_.adam_m), std::move(ck_.adam_v), st_.step}
                              : AdamState{ck_.adam_m.to_device(dev), ck_.adam_v.to_device(dev), st_.step}),
      w_dev_(dev == Device::CPU ? DraftWeights() : ck_.weights.to_device(dev)),
      w_(dev == Device::CPU ? ck_.weights : w_dev_),
      scratch_(StepScratch::zeros(ck_.config, dev, resolve_compute_dtype(opts.precision, dev))),
      nccl_(gradient_comm(dev, dp)),
      selected_(ck_.vocab.selected()),
      recipe_(step_recipe(opts)),
      progress_("train", "steps", static_cast<double>(total - st_.step), rank_, 0.0) {}

void StepLoop::run() {
  t0_ = loop_start_ = std::chrono::steady_clock::now();
  while (st_.step < total_) {
    const int64_t step = st_.step;
    const std::vector<int64_t> mine = BatchOrder::rank_share(order_.batch(step), rank_, dp_.size());
    const auto t_load = std::chrono::steady_clock::now();
    const std::vector<TTTSample> local = load_samples(step, mine);
    const double lr = sched_.at(step);
    const auto t_step = std::chrono::steady_clock::now();
    const StepMetrics m = train_step(ck_.config, w_, opt_, head_.embed_tokens, local, ck_.vocab, opts_.ttt_steps, lr,
                                     opts_.max_grad_norm, dp_, scratch_, nccl_.get(), recipe_);
    const auto t_done = std::chrono::steady_clock::now();
    load_seconds_ += std::chrono::duration<double>(t_step - t_load).count();
    step_seconds_ += std::chrono::duration<double>(t_done - t_step).count();
    check_grad_norm(m, step, mine);
    ++steps_run_;
    count_empty_step(m, step, mine);
    interval_.add(m);
    ++steps_in_interval_;
    st_.step = step + 1;
    maybe_log(step, lr);
    if (maybe_checkpoint(step)) break;
  }
  finish();
}

// This rank's samples of `step` as TTT samples on the run's device. A token id outside the target's
// vocabulary throws naming the sample; a sample with non-finite hidden states is skipped (named and counted);
// a step none of whose samples (on any rank) is finite throws.
std::vector<TTTSample> StepLoop::load_samples(int64_t step, const std::vector<int64_t>& mine) {
  std::vector<TTTSample> local;
  std::vector<HiddenSample> kept;  // the finite ones
  std::string skipped_here;  // this rank's non-finite samples of the step, for the message
  auto now = [] { return std::chrono::steady_clock::now(); };
  auto since = [&](std::chrono::steady_clock::time_point t) { return std::chrono::duration<double>(now() - t).count(); };
  auto t = now();
  std::vector<LoadedSample> loaded = source_.take(step, mine);
  take_seconds_ += since(t);
  for (size_t j = 0; j < mine.size(); ++j) {
    const SampleRef ref = st_.split.locate(mine[j]);
    HiddenSample hs = std::move(loaded[j].hs);
    const std::string bad = std::move(loaded[j].nonfinite);
    // A token id outside the target's vocabulary (a damaged shard, or one of another tokenizer's prepared
    // file): named here, not deep in the embedding lookup.
    const int64_t V = head_.embed_tokens.dim(0);
    for (size_t t = 0; t < hs.ids.size(); ++t)
      AERIE_CHECK(hs.ids[t] >= 0 && hs.ids[t] < V,
                  "train: " << st_.split.shards[static_cast<size_t>(ref.shard)] << " sample " << ref.index
                            << " (prepared sample " << hs.sample_index << ") holds token id " << hs.ids[t]
                            << " at position " << t << ", outside the target's vocabulary [0, " << V
                            << ") of --model (a damaged shard, or shards of another model's prepared file?)");
    // A sample with a NaN or infinity in its hidden states would make the whole step's gradient
    // non-finite: it is skipped, named and counted.
    if (!bad.empty()) {
      const std::string what = st_.split.shards[static_cast<size_t>(ref.shard)] + " sample " +
                               std::to_string(ref.index) + " (prepared sample " + std::to_string(hs.sample_index) +
                               ")";
      AERIE_LOG(warning) << "train: step " << step + 1 << ": skipping " << what << ": non-finite " << bad;
      skipped_here += (skipped_here.empty() ? "" : ", ") + what;
      ++skipped_local_;
      continue;
    }
    kept.push_back(std::move(hs));
  }
  // The targets are made where W_lm lives (final_hidden goes there), f goes to the device: on a GPU the step's
  // samples at once (one copy each way and one wait).
  t = now();
  local = make_step_samples(std::move(kept), head_.lm_head, selected_, dev_);
  targets_seconds_ += since(t);
  // Every rank's count of kept and skipped samples: a step none of whose samples is finite stops the run.
  Tensor counts = Tensor::from_vector<int64_t>({static_cast<int64_t>(local.size()), skipped_local_}, {2});
  dp_.all_reduce_sum(counts);
  skipped_local_ = 0;
  result_.skipped_nonfinite += counts.data<int64_t>()[1];
  interval_skipped_ += counts.data<int64_t>()[1];
  AERIE_CHECK(counts.data<int64_t>()[0] > 0,
              "train: every sample of step " << step + 1 << " has non-finite hidden states"
                                             << (skipped_here.empty() ? "" : " (this rank's: " + skipped_here + ")")
                                             << (stream_ != nullptr ? ": the target's forward overflowed (--target-dtype?)"
                                                                    : ": the shards are damaged or the target's forward overflowed; "
                                                                      "extract them again"));
  return local;
}

// A non-finite gradient norm from finite samples throws, naming this rank's samples.
void StepLoop::check_grad_norm(const StepMetrics& m, int64_t step, const std::vector<int64_t>& mine) {
  if (std::isfinite(m.grad_norm)) return;
  std::string samples;
  for (int64_t g : mine) {
    const SampleRef ref = st_.split.locate(g);
    samples += (samples.empty() ? "" : ", ") + st_.split.shards[static_cast<size_t>(ref.shard)] + " sample " +
               std::to_string(ref.index);
  }
  AERIE_THROW("train: non-finite gradient norm at step " << step + 1 << " (finite inputs; this rank's samples: "
                                                        << samples << "): lower --lr or --max-grad-norm");
}

// A step without a trainable row is counted; the first one is named on rank 0.
void StepLoop::count_empty_step(const StepMetrics& m, int64_t step, const std::vector<int64_t>& mine) {
  if (!m.valid.empty() && m.valid[0] != 0) return;
  // eagle3.md section 4: row t of TTT step 0 trains iff loss_mask[t + 2] = 1 and the target's token
  // at t + 1 is in the draft vocabulary; a batch without such a row gives loss 0 and no update.
  if (empty_steps_++ == 0 && rank_ == 0) {
    std::ostringstream ids;
    for (size_t i = 0; i < mine.size() && i < 8; ++i) ids << (i ? ", " : "") << mine[i];
    AERIE_LOG(warning) << "train: step " << step + 1 << " has no trainable row: none of its samples (rank 0's: "
                       << ids.str() << (mine.size() > 8 ? ", ..." : "")
                       << ") has a loss token at position >= 2 whose target token is in the draft vocabulary, "
                       << "so the step trains nothing (loss 0); further such steps are counted, not logged";
  }
}

// Every opts.log_every steps and at the last: the interval's metrics, logged on rank 0 and appended to
// metrics.jsonl and the event file; the progress line.
void StepLoop::maybe_log(int64_t step, double lr) {
  if (!(st_.step % opts_.log_every == 0 || st_.step == total_)) return;
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
  const double tps = secs > 0 ? static_cast<double>(interval_.tokens) / secs : 0.0;
  const double data_wait = source_.take_wait_seconds();
  total_data_wait_ += data_wait;
  if (rank_ == 0) {
    char buf[256];
    std::snprintf(buf, sizeof buf, "train: step %lld/%lld epoch %lld loss %.4f tau_sim %.3f lr %.3e grad_norm %.3f %.0f tokens/s",
                  static_cast<long long>(st_.step), static_cast<long long>(total_),
                  static_cast<long long>(order_.epoch_of(step)), interval_.loss(), interval_.tau_sim(), lr,
                  interval_.grad_norm, tps);
    AERIE_LOG(info) << buf << " | loss_k " << join(interval_.loss_k(), 4) << " | acc_k " << join(interval_.acc_k(), 3);
    nlohmann::json j = {{"step", st_.step},           {"epoch", order_.epoch_of(step)},
                        {"loss", interval_.loss()},   {"loss_k", interval_.loss_k()},
                        {"acc_k", interval_.acc_k()}, {"tau_sim", interval_.tau_sim()},
                        {"lr", lr},                   {"grad_norm", interval_.grad_norm},
                        {"tokens", interval_.tokens}, {"tokens_per_s", tps},
                        {"seconds", secs}};
    if (source_.reads_shards()) j["data_wait_s"] = data_wait;
    if (interval_skipped_ > 0) j["skipped_nonfinite"] = interval_skipped_;
    folder_.append_metrics(j, st_.step, interval_scalars(interval_, lr, tps));
  }
  progress_.add(static_cast<double>(steps_in_interval_));
  interval_skipped_ = 0;
  interval_ = StepMetrics();
  steps_in_interval_ = 0;
  t0_ = std::chrono::steady_clock::now();
}

// Every opts.checkpoint_every steps, at the last and when any rank got a stop signal: a checkpoint (the
// stop is decided first; streaming: the step's credit tells the target both). Returns true when stopping.
bool StepLoop::maybe_checkpoint(int64_t step) {
  const bool due = (opts_.checkpoint_every > 0 && st_.step % opts_.checkpoint_every == 0) || st_.step == total_;
  if (st_.step < total_) result_.stop_signal = any_stop_signal(dp_);
  const bool stopping = result_.stop_signal != 0;
  if (stream_ != nullptr)
    stream_->step_done(step, (due || stopping) && num_heldout_ > 0, stopping || st_.step == total_,
                       result_.stop_signal, rank_);
  if (due || stopping) result_.checkpoint = save_checkpoint_now();
  if (stopping && rank_ == 0)
    AERIE_LOG(warning) << "train: stopped by signal " << result_.stop_signal << " after step " << st_.step << " of "
                       << total_ << "; rerun the same command to resume from " << result_.checkpoint;
  return stopping;
}

// Scores the held-out samples, then writes the checkpoint of st.step from host copies (collective) and
// removes the old ones past --keep-checkpoints. Returns its folder.
std::string StepLoop::save_checkpoint_now() {
  if (num_heldout_ > 0) score_held_out();
  if (dev_ == Device::CPU) {
    ck_.adam_m = opt_.m;  // shares storage: no copy
    ck_.adam_v = opt_.v;
  } else {
    ck_.weights = w_.to_device(Device::CPU);
    ck_.adam_m = opt_.m.to_device(Device::CPU);
    ck_.adam_v = opt_.v.to_device(Device::CPU);
  }
  st_.epoch = order_.epoch_of(st_.step);
  st_.position = order_.position_of(st_.step);
  std::string dir = save_checkpoint(opts_.output_dir, ck_, vocab_file_, dp_);
  // The next checkpoint copies the vocabulary from this one: the one resumed from (or --vocab) may be
  // gone by then (--keep-checkpoints removes old checkpoints; found by the scaling-script helper).
  vocab_file_ = dir + "/draft_vocab.safetensors";
  if (rank_ == 0) {
    AERIE_LOG(info) << "train: checkpoint " << dir;
    const int removed = remove_old_checkpoints(opts_.output_dir, opts_.keep_checkpoints);
    if (removed > 0)
      AERIE_LOG(info) << "train: removed " << removed << " older checkpoint(s) of " << opts_.output_dir
                      << " (--keep-checkpoints " << opts_.keep_checkpoints << ")";
  }
  return dir;
}

// Teacher-forced acc_k / tau_sim of the draft now on the first opts.heldout_samples held-out samples
// (eagle3.md section 4, as `aerie eval` computes them), spread over dp; rank 0 logs and records them.
void StepLoop::score_held_out() {
  const int S = opts_.ttt_steps;
  const std::vector<double> ones(static_cast<size_t>(S), 1.0);
  TeacherForced tf;
  for (int64_t i = rank_; i < num_heldout_; i += dp_.size()) {
    const int64_t g = st_.split.eval[static_cast<size_t>(i)];
    HiddenSample hs = source_.heldout_sample(g, i);
    if (!all_finite(hs.aux_hidden) || !all_finite(hs.final_hidden)) continue;  // named when trained on
    TTTSample t = make_ttt_sample(std::move(hs.ids), std::move(hs.loss_mask), std::move(hs.aux_hidden),
                                  hs.final_hidden, head_.lm_head, selected_);
    if (dev_ != Device::CPU) t.aux_hidden = t.aux_hidden.to_device(dev_);
    tf.add(ttt_forward_backward(ck_.config, w_, head_.embed_tokens, t, ck_.vocab.d2t, ck_.vocab.t2d, S, ones, nullptr));
  }
  tf.all_reduce(dp_, S);
  if (rank_ != 0) return;
  // The first line says what the figures are, and why fewer samples than --heldout-samples were scored.
  std::ostringstream what;
  if (!heldout_logged_ && num_heldout_ < opts_.heldout_samples)
    what << "; the held-out split (--eval-fraction) has " << num_heldout_ << " of the --heldout-samples "
         << opts_.heldout_samples;
  AERIE_LOG(info) << "train: step " << st_.step << " held out (" << tf.samples << " samples" << what.str()
                  << "): tau_sim " << tf.tau_sim() << (heldout_logged_ ? "" : " (teacher-forced acceptance length)")
                  << " | acc_k " << join(tf.acc_k(), 3)
                  << (heldout_logged_ ? "" : " (the acceptance of each TTT step k along the data)");
  heldout_logged_ = true;
  const nlohmann::json j = {{"step", st_.step}, {"tau_sim", tf.tau_sim()}, {"acc_k", tf.acc_k()}, {"samples", tf.samples}};
  Scalars s = {{"heldout/tau_sim", tf.tau_sim()}};
  const std::vector<double> acc = tf.acc_k();
  for (size_t k = 0; k < acc.size(); ++k) s.emplace_back("heldout/acc_k/" + std::to_string(k), acc[k]);
  folder_.append_heldout(j, st_.step, s);
}

// After the last step (or a stop): the stream drained, the progress and data-wait lines, and the checks
// and warnings of the whole run (a run none of whose steps trained throws).
void StepLoop::finish() {
  if (stream_ != nullptr) {
    stream_->finish(st_.step - 1, [&](int64_t s) { return order_.batch(s); }, rank_, dp_.size());
    if (rank_ == 0)
      AERIE_LOG(info) << "train: trainer rank 0 received " << stream_->received_bytes() / (1 << 20) << " MiB of hidden states "
                      << "from the target and waited " << std::fixed << std::setprecision(1) << stream_->wait_seconds()
                      << " s for them";
  }
  if (result_.stop_signal == 0) progress_.finish();
  total_data_wait_ += source_.take_wait_seconds();
  if (source_.reads_shards() && rank_ == 0 && steps_run_ > 0) {
    const double loop_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - loop_start_).count();
    AERIE_LOG(info) << "train: the steps waited " << std::fixed << std::setprecision(1) << total_data_wait_
                    << " s for shard reads (" << (loop_s > 0 ? 100.0 * total_data_wait_ / loop_s : 0.0)
                    << "% of " << loop_s << " s; read one step ahead)";
  }
  if (rank_ == 0 && steps_run_ > 0) {
    const double loop_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - loop_start_).count();
    AERIE_LOG(info) << "train: rank 0's loop: " << std::fixed << std::setprecision(1) << load_seconds_
                    << " s making the samples ready (taken " << take_seconds_ << " s, the target's distributions "
                    << "and the copies to the device " << targets_seconds_ << " s), " << step_seconds_
                    << " s in the steps (forward, backward, gradients, update), "
                    << std::max(0.0, loop_s - load_seconds_ - step_seconds_) << " s the rest (logs, checkpoints, "
                    << "held-out scoring) of " << loop_s << " s";
  }
  AERIE_CHECK(steps_run_ == 0 || empty_steps_ < steps_run_,
              "train: none of the " << steps_run_ << " steps had a trainable row (loss 0, nothing learned): the "
                                    << "samples' loss tokens all sit at positions 0-1, or their target tokens are "
                                    << "all outside the draft vocabulary (" << opts_.vocab_path << ")");
  if (empty_steps_ > 0 && rank_ == 0)
    AERIE_LOG(warning) << "train: " << empty_steps_ << " of " << steps_run_ << " steps had no trainable row";
  if (rank_ == 0 && result_.skipped_nonfinite > 0)
    AERIE_LOG(warning) << "train: skipped " << result_.skipped_nonfinite << " draw(s) of samples with non-finite hidden "
                       << "states (named above; skipped_nonfinite in metrics.jsonl)";
  result_.step = st_.step;
}

}  // namespace

TrainResult run_training(const TrainOptions& given_opts, Communicator& dp, StreamClient* stream) {
  TrainOptions opts = given_opts;  // a resume may take settings from its checkpoint
  const int rank = dp.rank();
  AERIE_CHECK(!opts.output_dir.empty(), "train: --output is required");
  AERIE_CHECK(opts.log_every >= 1, "train: --log-every must be >= 1");
  AERIE_CHECK(opts.ttt_steps >= 1, "train: --ttt-steps must be >= 1");
  const Device dev = choose_train_device(opts, dp);
  const TargetConfig target = load_target_config(opts.model_dir);
  const TargetFingerprint model_fp = TargetFingerprint::of_model(opts.model_dir);
  const ShardSet shards = training_shards(opts, target, model_fp, stream, rank);
  pick_auto_window(opts, shards, target, rank);
  // The target's head after the cheap checks of the shards (GiBs for a large vocabulary).
  const TargetHead head = load_head(opts.model_dir, target, dev);
  // Rank 0 writes the run folder and holds its lock unless the job took it already (jobs/train.cc).
  RunFolder folder(opts.output_dir, dp);

  RunStart start = start_or_resume(opts, dp, stream != nullptr, target, model_fp, shards, head);
  TrainState& st = start.ck.state;
  BatchOrder order(st.split, opts.batch_size, opts.seed);
  st.steps_per_epoch = order.steps_per_epoch();
  const int64_t total = opts.steps > 0 ? opts.steps : std::max<int64_t>(1, opts.epochs) * order.steps_per_epoch();
  refusals_agreed(dp, stream == nullptr, [&] {
    AERIE_CHECK(!start.latest || st.total_steps == total,
                "resume: " << total << " total steps now, the checkpoint planned " << st.total_steps);
  });
  st.total_steps = total;
  const LrSchedule sched = LrSchedule::make(opts.lr, total, opts.warmup_ratio);
  folder.start(st.split, start.latest.has_value(), st.step);
  if (rank == 0)
    log_run_start(opts, st.split, stream != nullptr, shards.paths.size(), total, dp.size(), order.steps_per_epoch(),
                  sched, start.ck.config, dev);

  TrainResult result;
  result.total_steps = total;
  const int64_t num_heldout = std::min<int64_t>(opts.heldout_samples, static_cast<int64_t>(st.split.eval.size()));
  if (stream != nullptr) start_stream(*stream, opts, st, total, num_heldout, dp);
  if (st.step >= total) {
    if (rank == 0) AERIE_LOG(info) << "train: the checkpoint is already at step " << st.step << " of " << total;
    if (stream != nullptr) stream->finish(st.step - 1, [&](int64_t s) { return order.batch(s); }, rank, dp.size());
    result.checkpoint = *start.latest;
    result.step = st.step;
    return result;
  }
  if (start.latest) result.checkpoint = *start.latest;
  folder.open_events();  // a new event file per run or resume, beside metrics.jsonl
  StopSignals stop_signals;
  auto share_of = [&order, rank, &dp](int64_t s) { return BatchOrder::rank_share(order.batch(s), rank, dp.size()); };
  const std::unique_ptr<SampleSource> source = stream != nullptr ? stream_source(*stream, rank, dp.size())
                                                                 : shard_source(st.split, share_of, total,
                                                                                dev == Device::CPU ? DType::F32 : DType::BF16);
  StepLoop loop(opts, dp, dev, stream, head, start, order, sched, total, num_heldout, folder, *source, result);
  loop.run();
  return result;
}

}  // namespace aerie
