// Streaming training: `aerie train --target-model DIR --prepared prepared.h5` runs the
// target and the draft's training in one MPI job and stores no shards. For DeepSeek-V3 and Kimi (H = 7168) a
// token's hidden states take 56 KiB in bf16, so a large regenerated set does not fit on any disk; here they
// live only in the messages from the target's ranks to the training ranks.
//
// Ranks (StreamLayout): world ranks 0 .. target_ranks-1 run the target, in target_ranks / tp replicas of tp
// consecutive ranks (tensor parallel inside a replica, as `aerie extract --tp`); the other ranks train the
// draft data-parallel (dp rank r = world rank target_ranks + r), exactly as offline `aerie train` does.
//
// Data order: global sample g of the run is prepared sample g, so the split (the last eval_fraction held out)
// and every step's batch are those of offline train on the shards of `aerie extract` of the same prepared
// file (chunk c of extract = prepared samples [c S, (c+1) S) = shard c). Both sides compute the batches from
// the same (split, seed, batch size); nothing but the plan and the hidden states crosses.
//
// Protocol (MPI point to point over MPI_COMM_WORLD, host buffers):
//   - START (kStreamStartTag): trainer dp rank 0 -> every replica leader: the StreamPlan.
//   - TRAIN (kStreamTrainTag): batch position i of step s (sample g) is computed by replica i % R (R
//     replicas) and sent by its leader to trainer dp rank i % dp (the rank BatchOrder::rank_share gives it),
//     in step order and position order; the message is one StreamMessage (header [g, T, H], then the
//     sample's aux hidden states [T, 3H] and final hidden states [T, H] in bf16, rounded as a bf16 shard
//     stores them). The trainer reads the sample's ids and loss mask from the prepared file itself.
//   - CREDIT (kStreamCreditTag): after each trained step s, trainer dp rank 0 -> every leader:
//     [s, heldout, last, signal]. heldout = 1: the trainers score the held-out samples now (a checkpoint),
//     so the leaders send them (HELDOUT, held-out i from replica i % R to trainer i % dp); last = 1: no step
//     follows in this run (the end, or a stop signal: `signal`). The queue: a leader computes step s only
//     after the credit of step s - queue - 1, so it runs at most queue + 1 steps ahead of the trainers and
//     holds at most that many steps of messages.
//   - END (kStreamEndTag): after the last credit every leader tells every trainer the last step it
//     computed; the trainers receive and drop the steps past their last one, so no message is left in flight.
// Checkpoints: only the trainers hold state (the target is frozen and the data order is a function of the
// step), so a resumed run starts the target at the checkpoint's step; a killed run resumes bitwise like
// offline train. Equality with offline extract + train: the same hidden states (bit for bit when the
// target's forward is the same computation: on the CPU one sample per forward, as extract does) in the
// same order give the same draft.
#pragma once
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "data/extract.h"
#include "data/shard.h"

namespace aerie {

inline constexpr int kStreamStartTag = 7201;
inline constexpr int kStreamCreditTag = 7202;
inline constexpr int kStreamTrainTag = 7203;
inline constexpr int kStreamHeldoutTag = 7204;
inline constexpr int kStreamEndTag = 7205;

/// Which world ranks run the target and which train.
struct StreamLayout {
  int world_size = 0;
  int target_ranks = 1;  // world ranks 0 .. target_ranks - 1
  int tp = 1;            // ranks per target replica
  /// Throws aerie::Error naming the option when target_ranks < 1, tp < 1, tp does not divide target_ranks,
  /// or no rank is left to train (world_size <= target_ranks).
  StreamLayout(int world_size, int target_ranks, int tp);
  int replicas() const { return target_ranks / tp; }
  int trainers() const { return world_size - target_ranks; }
  bool is_target(int world_rank) const { return world_rank < target_ranks; }
  int leader(int replica) const { return replica * tp; }               // world rank of a replica's leader
  int trainer(int dp_rank) const { return target_ranks + dp_rank; }    // world rank of a trainer
};

/// What the trainers tell the target at start (START): the steps to run and the data order.
struct StreamPlan {
  int64_t start_step = 0, total_steps = 0;  // steps [start_step, total_steps) of this run
  int64_t batch_size = 1;
  uint64_t seed = 0;
  int64_t num_samples = 0;  // prepared samples (the split's N)
  int64_t num_train = 0;    // the training samples are 0 .. num_train - 1, the held-out ones the rest
  int64_t num_heldout = 0;  // held-out samples scored at each checkpoint: num_train .. num_train + num_heldout - 1
  int64_t queue = 2;        // steps the target may compute ahead of the one being trained (>= 0)
  int64_t trainers = 1;     // dp size
  std::vector<int64_t> to_vector() const;
  /// Throws aerie::Error on a vector of another length.
  static StreamPlan from_vector(const std::vector<int64_t>& v);
};

/// The trainer side: receives the hidden states of the samples it trains on. One per trainer rank; not
/// thread-safe. `world` is MPI_COMM_WORLD's communicator (the messages cross the two sides).
class StreamClient {
 public:
  /// Opens the prepared file (ids and loss masks are read from it). Throws aerie::Error naming the file.
  StreamClient(MpiCommunicator& world, const StreamLayout& layout, const std::string& prepared,
               std::vector<int> aux_layers);
  const std::string& prepared_path() const { return prepared_.path(); }
  int64_t num_samples() const { return prepared_.num_samples(); }
  const PreparedFile& prepared() const { return prepared_; }
  const std::vector<int>& aux_layers() const { return aux_layers_; }
  /// Trainer dp rank 0: sends `plan` to every replica leader (the others do nothing). Call once, before
  /// any sample is received, also when the run has no step left (the target then ends at once).
  void start(const StreamPlan& plan, int dp_rank);
  /// The sample at batch position `pos` of the step being trained (global id g): blocks until its replica
  /// sent it. Call in step order and, within a step, in position order (this rank's positions only).
  /// Hidden states F32 [T, 3H] / [T, H] (from bf16), as ShardReader::read returns them. Throws
  /// aerie::Error when the message is not sample g or its shape disagrees with the prepared file.
  HiddenSample train_sample(int64_t g, int64_t pos);
  /// Held-out sample i of the scoring the last step_done announced (global id g); the same order rule.
  HiddenSample heldout_sample(int64_t g, int64_t i);
  /// Trainer dp rank 0, after step `step` (0-based) is trained by every trainer: the credit; `heldout`:
  /// the held-out samples are scored now; `last`: no step follows in this run (`signal`: the stop
  /// signal, 0 at the end). The others do nothing.
  void step_done(int64_t step, bool heldout, bool last, int signal, int dp_rank);
  /// After the last step_done (every trainer): receives every leader's END and drops the samples of
  /// this rank past `last_step` (the steps the target computed ahead). `batches(s)` gives step s's batch.
  void finish(int64_t last_step, const std::function<std::vector<int64_t>(int64_t)>& batches, int dp_rank,
              int dp_size);
  /// Seconds this rank waited for hidden states (received or blocked in train_sample / heldout_sample).
  double wait_seconds() const { return wait_s_; }
  int64_t received_bytes() const { return bytes_; }

 private:
  HiddenSample receive(int src, int tag, int64_t g);
  MpiCommunicator& world_;
  StreamLayout layout_;
  PreparedFile prepared_;
  std::vector<int> aux_layers_;
  double wait_s_ = 0;
  int64_t bytes_ = 0;
};

/// What a target rank did (its replica's counts; the same on the replica's ranks).
struct StreamTargetStats {
  int64_t samples = 0, tokens = 0;  // forwarded by this replica (training and held-out samples)
  int64_t last_step = -1;           // the last step computed
  double forward_seconds = 0;       // in the target's forward (and the device-to-host copy)
  double wait_seconds = 0;          // waiting for the trainers' credits (the queue full)
  int stop_signal = 0;              // the signal that stopped the trainers (0: the run ended)
};

/// The target side, on every target rank: receives the plan, computes its replica's samples of every step
/// and held-out scoring, sends them, and returns after the trainers' last credit. `tp` is the replica's
/// communicator (host MPI; the forward's own collectives may go over NCCL), `forward` and (optional,
/// non-null: consecutive samples of a step share a forward up to batch_tokens rows) `forward_batch` as
/// for run_extract (collective over the replica). `vocab_size` > 0: every id must lie in [0, V) (an error
/// naming the prepared file and sample). Rank 0 of the world logs the target's throughput every
/// log_every_s seconds. Throws aerie::Error on a bad message or input (the job then aborts).
StreamTargetStats run_stream_target(MpiCommunicator& world, const StreamLayout& layout, MpiCommunicator& tp,
                                    const std::string& prepared, int64_t vocab_size, const TargetForward& forward,
                                    const TargetForwardBatch& forward_batch, int64_t batch_tokens,
                                    double log_every_s = 30.0);

}  // namespace aerie
