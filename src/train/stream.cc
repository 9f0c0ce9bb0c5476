// Streaming training: the two sides of the protocol in stream.h.
#include "train/stream.h"

#include <chrono>
#include <climits>
#include <cstring>
#include <deque>
#include <memory>
#include <iomanip>
#include <sstream>

#include "core/error.h"
#include "core/log.h"
#include "core/stop_signals.h"
#include "train/data_order.h"

namespace aerie {

namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

constexpr int64_t kHeaderBytes = 3 * sizeof(int64_t);  // g, T, H

// `v` from rank 0 of `c` to all its ranks (its length first).
std::vector<int64_t> broadcast_vector(MpiCommunicator& c, std::vector<int64_t> v) {
  if (c.size() == 1) return v;
  Tensor n = Tensor::from_vector<int64_t>({static_cast<int64_t>(v.size())}, {1});
  c.broadcast(n, 0);
  v.resize(static_cast<size_t>(n.data<int64_t>()[0]));
  if (!v.empty()) {
    Tensor t = Tensor::wrap(v.data(), {static_cast<int64_t>(v.size())}, DType::I64);
    c.broadcast(t, 0);
  }
  return v;
}

// A [rows, cols] tensor of the target's forward (F32 or BF16, host or GPU) as host BF16, rounded to
// nearest even as a bf16 shard stores it (data/shard.cc).
Tensor host_bf16(const Tensor& t) {
  Tensor h = t.device() == Device::CPU ? t : t.to_device(Device::CPU);
  return h.dtype() == DType::BF16 ? h : h.to(DType::BF16);
}

// One TRAIN / HELDOUT message: [g, T, H] then rows [r0, r0 + T) of aux [*, 3H] and fin [*, H] (host BF16).
std::vector<uint8_t> pack(int64_t g, const Tensor& aux, const Tensor& fin, int64_t r0, int64_t T) {
  const int64_t H = fin.shape()[1];
  const int64_t bytes = kHeaderBytes + T * 4 * H * 2;
  AERIE_CHECK(bytes <= INT_MAX, "train (stream): sample " << g << " has " << T << " tokens: its hidden states ("
                                                          << bytes << " bytes) exceed one MPI message (2 GiB)");
  std::vector<uint8_t> buf(static_cast<size_t>(bytes));
  const int64_t head[3] = {g, T, H};
  std::memcpy(buf.data(), head, kHeaderBytes);
  std::memcpy(buf.data() + kHeaderBytes, static_cast<const uint8_t*>(aux.raw()) + r0 * 3 * H * 2,
              static_cast<size_t>(T * 3 * H * 2));
  std::memcpy(buf.data() + kHeaderBytes + T * 3 * H * 2, static_cast<const uint8_t*>(fin.raw()) + r0 * H * 2,
              static_cast<size_t>(T * H * 2));
  return buf;
}

}  // namespace

StreamLayout::StreamLayout(int world_size_, int target_ranks_, int tp_)
    : world_size(world_size_), target_ranks(target_ranks_), tp(tp_) {
  AERIE_CHECK(target_ranks >= 1, "train: --target-ranks must be >= 1, got " << target_ranks);
  AERIE_CHECK(tp >= 1 && target_ranks % tp == 0,
              "train: --tp " << tp << " must divide --target-ranks " << target_ranks << " (ranks per target replica)");
  AERIE_CHECK(world_size > target_ranks, "train: streaming needs more ranks than --target-ranks " << target_ranks
                                                                                               << " (the rest train the draft); "
                                                                                               << "the job has " << world_size);
}

std::vector<int64_t> StreamPlan::to_vector() const {
  return {start_step, total_steps, batch_size, static_cast<int64_t>(seed), num_samples, num_train, num_heldout, queue,
          trainers};
}

StreamPlan StreamPlan::from_vector(const std::vector<int64_t>& v) {
  AERIE_CHECK(v.size() == 9, "train (stream): a plan of " << v.size() << " values, expected 9");
  StreamPlan p;
  p.start_step = v[0];
  p.total_steps = v[1];
  p.batch_size = v[2];
  p.seed = static_cast<uint64_t>(v[3]);
  p.num_samples = v[4];
  p.num_train = v[5];
  p.num_heldout = v[6];
  p.queue = v[7];
  p.trainers = v[8];
  return p;
}

// ---- the trainer side ------------------------------------------------------------------------------------

StreamClient::StreamClient(MpiCommunicator& world, const StreamLayout& layout, const std::string& prepared,
                           std::vector<int> aux_layers)
    : world_(world), layout_(layout), prepared_(prepared), aux_layers_(std::move(aux_layers)) {}

void StreamClient::start(const StreamPlan& plan, int dp_rank) {
  if (dp_rank != 0) return;
  for (int r = 0; r < layout_.replicas(); ++r) world_.send(plan.to_vector(), layout_.leader(r), kStreamStartTag);
}

HiddenSample StreamClient::receive(int src, int tag, int64_t g) {
  const auto t0 = Clock::now();
  MPI_Status st;
  check_mpi(MPI_Probe(src, tag, world_.handle(), &st), "MPI_Probe (stream)");
  int n = 0;
  MPI_Get_count(&st, MPI_BYTE, &n);
  std::vector<uint8_t> buf(static_cast<size_t>(n));
  check_mpi(MPI_Recv(buf.data(), n, MPI_BYTE, src, tag, world_.handle(), MPI_STATUS_IGNORE), "MPI_Recv (stream)");
  wait_s_ += since(t0);
  bytes_ += n;
  int64_t head[3] = {-1, 0, 0};
  AERIE_CHECK(n >= kHeaderBytes, "train (stream): a message of " << n << " bytes from target rank " << src);
  std::memcpy(head, buf.data(), kHeaderBytes);
  const int64_t T = head[1], H = head[2];
  AERIE_CHECK(head[0] == g, "train (stream): target rank " << src << " sent prepared sample " << head[0]
                                                           << " where sample " << g
                                                           << " was due (the two sides disagree on the data order: "
                                                              "the same --batch-size, --seed and --eval-fraction?)");
  HiddenSample s;
  s.sample_index = g;
  prepared_.read_tokens(g, g + 1, s.ids, s.loss_mask);
  AERIE_CHECK(static_cast<int64_t>(s.ids.size()) == T && H > 0 && n == kHeaderBytes + T * 4 * H * 2,
              "train (stream): target rank " << src << " sent sample " << g << " as " << T << " tokens of hidden size "
                                             << H << " in " << n << " bytes; " << prepared_.path() << " gives it "
                                             << s.ids.size() << " tokens");
  // Widened straight from the message (views of its bytes; no copy of the bf16 rows first).
  s.aux_hidden = Tensor::wrap(buf.data() + kHeaderBytes, {T, 3 * H}, DType::BF16).to(DType::F32);
  s.final_hidden = Tensor::wrap(buf.data() + kHeaderBytes + T * 3 * H * 2, {T, H}, DType::BF16).to(DType::F32);
  return s;
}

HiddenSample StreamClient::train_sample(int64_t g, int64_t pos) {
  return receive(layout_.leader(static_cast<int>(pos % layout_.replicas())), kStreamTrainTag, g);
}

HiddenSample StreamClient::heldout_sample(int64_t g, int64_t i) {
  return receive(layout_.leader(static_cast<int>(i % layout_.replicas())), kStreamHeldoutTag, g);
}

void StreamClient::step_done(int64_t step, bool heldout, bool last, int signal, int dp_rank) {
  if (dp_rank != 0) return;
  for (int r = 0; r < layout_.replicas(); ++r)
    world_.send({step, heldout ? 1 : 0, last ? 1 : 0, signal}, layout_.leader(r), kStreamCreditTag);
}

void StreamClient::finish(int64_t last_step, const std::function<std::vector<int64_t>(int64_t)>& batches,
                          int dp_rank, int dp_size) {
  const int R = layout_.replicas();
  for (int r = 0; r < R; ++r) {
    const std::vector<int64_t> end = world_.recv(layout_.leader(r), kStreamEndTag);
    AERIE_CHECK(end.size() == 1, "train (stream): a bad END message from target rank " << layout_.leader(r));
    for (int64_t s = last_step + 1; s <= end[0]; ++s) {
      const std::vector<int64_t> b = batches(s);
      for (size_t i = static_cast<size_t>(dp_rank); i < b.size(); i += static_cast<size_t>(dp_size))
        if (static_cast<int>(i % static_cast<size_t>(R)) == r) receive(layout_.leader(r), kStreamTrainTag, b[i]);
    }
  }
}

// ---- the target side -------------------------------------------------------------------------------------

namespace {

// One target rank of a streaming run (run_stream_target): its replica's samples of every step and of the
// held-out scoring through the target and, on the replica's leader, sent to the trainers as their credits
// allow. The constructor receives the plan (collective over the replica).
class StreamTargetRank {
 public:
  StreamTargetRank(MpiCommunicator& world, const StreamLayout& layout, MpiCommunicator& tp,
                   const std::string& prepared_path, int64_t vocab_size, const TargetForward& forward,
                   const TargetForwardBatch& forward_batch, int64_t batch_tokens, double log_every_s);
  StreamTargetStats run();

 private:
  struct Pending {
    int64_t step;  // -1: held-out
    MPI_Request req;
    std::vector<uint8_t> buf;
  };
  void note_signal();
  void progress_sends();
  void log_rate(bool final);
  std::vector<std::vector<int32_t>> read_ids(const std::vector<int64_t>& gs) const;
  void compute(const std::vector<int64_t>& gs, const std::vector<int>& dest, int tag, int64_t step);
  void serve_heldout();
  void take_credit();
  void lead();
  void follow();

  MpiCommunicator& world_;
  const StreamLayout& layout_;
  MpiCommunicator& tp_;
  const std::string& prepared_path_;
  const int64_t vocab_size_;
  const TargetForward& forward_;
  const TargetForwardBatch& forward_batch_;
  const int64_t batch_tokens_;
  const double log_every_s_;
  const int wr_, replica_, R_;
  const bool leader_;
  const PreparedFile prepared_;
  StreamPlan plan_;
  DataSplit split_;                     // the prepared file as one shard (BatchOrder reads it)
  std::unique_ptr<BatchOrder> order_;   // none when the run has no step left
  StreamTargetStats stats_;
  bool signal_noted_ = false;
  std::deque<Pending> pending_;
  Clock::time_point last_log_, started_;
  int64_t logged_tokens_ = 0;
  int64_t credit_ = 0;  // the step whose credit comes next (the leader)
  bool done_ = false;   // the trainers' last credit came (the leader)
};

StreamTargetRank::StreamTargetRank(MpiCommunicator& world, const StreamLayout& layout, MpiCommunicator& tp,
                                   const std::string& prepared_path, int64_t vocab_size,
                                   const TargetForward& forward, const TargetForwardBatch& forward_batch,
                                   int64_t batch_tokens, double log_every_s)
    : world_(world),
      layout_(layout),
      tp_(tp),
      prepared_path_(prepared_path),
      vocab_size_(vocab_size),
      forward_(forward),
      forward_batch_(forward_batch),
      batch_tokens_(batch_tokens),
      log_every_s_(log_every_s),
      wr_(world.rank()),
      replica_(wr_ / layout.tp),
      R_(layout.replicas()),
      leader_(tp.rank() == 0),
      prepared_(prepared_path) {
  plan_ = StreamPlan::from_vector(
      broadcast_vector(tp, leader_ ? world.recv(layout.trainer(0), kStreamStartTag) : std::vector<int64_t>{}));
  AERIE_CHECK(plan_.num_samples == prepared_.num_samples(),
              "train (stream): the trainers count " << plan_.num_samples << " samples, " << prepared_path << " holds "
                                                   << prepared_.num_samples());
  AERIE_CHECK(plan_.trainers == layout.trainers() && plan_.queue >= 0 && plan_.num_train >= 1 &&
                  plan_.num_train + plan_.num_heldout <= plan_.num_samples,
              "train (stream): a bad plan from the trainers");
  split_.shards = {prepared_path};
  split_.shard_sizes = {plan_.num_samples};
  for (int64_t g = 0; g < plan_.num_train; ++g) split_.train.push_back(g);
  for (int64_t g = plan_.num_train; g < plan_.num_samples; ++g) split_.eval.push_back(g);
  const bool has_steps = plan_.start_step < plan_.total_steps;
  if (has_steps) order_ = std::make_unique<BatchOrder>(split_, plan_.batch_size, plan_.seed);
  stats_.last_step = plan_.start_step - 1;
  credit_ = plan_.start_step;
  done_ = !has_steps;
  last_log_ = started_ = Clock::now();
}

StreamTargetStats StreamTargetRank::run() {
  if (leader_)
    lead();
  else
    follow();
  log_rate(true);
  return stats_;
}

// Once: a signal that reached this rank alone does not stop the run.
void StreamTargetRank::note_signal() {
  if (signal_noted_ || StopSignals::received() == 0) return;
  signal_noted_ = true;
  AERIE_LOG(warning) << "train (target): world rank " << wr_ << " received signal " << StopSignals::received()
                     << "; the target's ranks end when the training ranks stop, which they do (with a checkpoint) "
                     << "on a signal of their own (Slurm signals every task; by hand, signal mpirun or a "
                     << "training rank)";
}

// Lets MPI move the messages in flight (and frees the finished ones in order).
void StreamTargetRank::progress_sends() {
  while (!pending_.empty()) {
    int done = 0;
    check_mpi(MPI_Test(&pending_.front().req, &done, MPI_STATUS_IGNORE), "MPI_Test (stream)");
    if (!done) break;
    pending_.pop_front();
  }
}

// World rank 0: the target's throughput every log_every_s seconds, and at the end (`final`).
void StreamTargetRank::log_rate(bool final) {
  if (wr_ != 0 || (!final && since(last_log_) < log_every_s_)) return;
  const double dt = since(last_log_), all = since(started_);
  std::ostringstream os;
  os << std::fixed << std::setprecision(0) << "train (target): " << (final ? "done at" : "at") << " step "
     << stats_.last_step + 1 << " of " << plan_.total_steps << ", replica 0 forwarded " << stats_.samples << " samples, "
     << (final ? static_cast<double>(stats_.tokens) / std::max(all, 1e-9)
               : static_cast<double>(stats_.tokens - logged_tokens_) / std::max(dt, 1e-9))
     << " tokens/s" << std::setprecision(1) << " (forward " << stats_.forward_seconds << " s, waited for the trainers "
     << stats_.wait_seconds << " s of " << all << " s)";
  AERIE_LOG(info) << os.str();
  last_log_ = Clock::now();
  logged_tokens_ = stats_.tokens;
}

// The ids of prepared samples `gs`, each non-empty and (vocab_size > 0) within the target's vocabulary.
std::vector<std::vector<int32_t>> StreamTargetRank::read_ids(const std::vector<int64_t>& gs) const {
  std::vector<std::vector<int32_t>> ids(gs.size());
  for (size_t k = 0; k < gs.size(); ++k) {
    std::vector<uint8_t> mask;
    prepared_.read_tokens(gs[k], gs[k] + 1, ids[k], mask);
    AERIE_CHECK(!ids[k].empty(), "train (stream): prepared sample " << gs[k] << " of " << prepared_path_ << " is empty");
    if (vocab_size_ > 0)
      for (size_t t = 0; t < ids[k].size(); ++t)
        AERIE_CHECK(ids[k][t] >= 0 && ids[k][t] < vocab_size_,
                    "train (stream): prepared sample " << gs[k] << " of " << prepared_path_ << " has id " << ids[k][t]
                                                       << " at position " << t << ", outside the target's vocabulary [0, "
                                                       << vocab_size_ << ")");
  }
  return ids;
}

// Computes samples `gs` (the replica's, in order) and, on the leader, sends sample k to world rank
// dest[k] with `tag`. Collective over the replica: the leader broadcasts the command [n, g_0 ..], which
// the other ranks received before they call it.
void StreamTargetRank::compute(const std::vector<int64_t>& gs, const std::vector<int>& dest, int tag, int64_t step) {
  if (leader_) {
    std::vector<int64_t> cmd = {static_cast<int64_t>(gs.size())};
    cmd.insert(cmd.end(), gs.begin(), gs.end());
    broadcast_vector(tp_, cmd);
  }
  note_signal();
  const auto t0 = Clock::now();
  const std::vector<std::vector<int32_t>> ids = read_ids(gs);
  size_t k = 0;
  while (k < gs.size()) {
    // A group: consecutive samples up to batch_tokens rows (forward_batch), else one sample.
    size_t e = k + 1;
    int64_t rows = static_cast<int64_t>(ids[k].size());
    if (forward_batch_ && batch_tokens_ > 0)
      while (e < gs.size() && rows + static_cast<int64_t>(ids[e].size()) <= batch_tokens_)
        rows += static_cast<int64_t>(ids[e++].size());
    Tensor aux, fin;
    if (e - k == 1 || !forward_batch_) {
      forward_(ids[k], aux, fin);
      e = k + 1;
    } else {
      forward_batch_(std::vector<std::vector<int32_t>>(ids.begin() + static_cast<std::ptrdiff_t>(k),
                                                       ids.begin() + static_cast<std::ptrdiff_t>(e)),
                     aux, fin);
    }
    if (leader_) {
      const Tensor ha = host_bf16(aux), hf = host_bf16(fin);
      int64_t r0 = 0;
      for (size_t j = k; j < e; ++j) {
        const auto T = static_cast<int64_t>(ids[j].size());
        Pending p{step, MPI_REQUEST_NULL, pack(gs[j], ha, hf, r0, T)};
        check_mpi(MPI_Isend(p.buf.data(), static_cast<int>(p.buf.size()), MPI_BYTE, dest[j], tag, world_.handle(),
                            &p.req),
                  "MPI_Isend (stream)");
        pending_.push_back(std::move(p));
        r0 += T;
        stats_.tokens += T;
      }
      progress_sends();
    } else {
      for (size_t j = k; j < e; ++j) stats_.tokens += static_cast<int64_t>(ids[j].size());
    }
    stats_.samples += static_cast<int64_t>(e - k);
    k = e;
  }
  stats_.forward_seconds += since(t0);
}

// The replica's share of the held-out samples (held-out i from replica i % R to trainer i % dp).
void StreamTargetRank::serve_heldout() {
  std::vector<int64_t> gs;
  std::vector<int> dest;
  for (int64_t i = replica_; i < plan_.num_heldout; i += R_) {
    gs.push_back(plan_.num_train + i);
    dest.push_back(layout_.trainer(static_cast<int>(i % plan_.trainers)));
  }
  compute(gs, dest, kStreamHeldoutTag, -1);
}

// The leader: the trainers' credit for the next step (the held-out samples when it asks for them; the
// end when it says so).
void StreamTargetRank::take_credit() {
  const auto t0 = Clock::now();
  const std::vector<int64_t> c = world_.recv(layout_.trainer(0), kStreamCreditTag);
  stats_.wait_seconds += since(t0);
  AERIE_CHECK(c.size() == 4 && c[0] == credit_, "train (stream): the trainers' credit for step "
                                                    << (c.empty() ? -1 : c[0]) << " where step " << credit_
                                                    << " was due");
  ++credit_;
  if (c[1] != 0) serve_heldout();
  if (c[2] != 0) {
    done_ = true;
    stats_.stop_signal = static_cast<int>(c[3]);
  }
}

// The leader: every step's samples of the replica, at most plan.queue steps ahead of the credits; then
// END to every trainer, the sends completed, and the replica's other ranks released with the totals.
void StreamTargetRank::lead() {
  for (int64_t s = plan_.start_step; s < plan_.total_steps && !done_; ++s) {
    while (!done_ && credit_ < s - plan_.queue) take_credit();
    if (done_) break;
    const std::vector<int64_t> batch = order_->batch(s);
    std::vector<int64_t> gs;
    std::vector<int> dest;
    for (size_t i = static_cast<size_t>(replica_); i < batch.size(); i += static_cast<size_t>(R_)) {
      gs.push_back(batch[i]);
      dest.push_back(layout_.trainer(static_cast<int>(i % static_cast<size_t>(plan_.trainers))));
    }
    compute(gs, dest, kStreamTrainTag, s);
    stats_.last_step = s;
    log_rate(false);
  }
  while (!done_) take_credit();
  for (int t = 0; t < layout_.trainers(); ++t) world_.send({stats_.last_step}, layout_.trainer(t), kStreamEndTag);
  for (Pending& p : pending_) check_mpi(MPI_Wait(&p.req, MPI_STATUS_IGNORE), "MPI_Wait (stream)");
  pending_.clear();
  broadcast_vector(tp_, {-1});  // the replica's other ranks end
  std::vector<int64_t> tail = {stats_.last_step, stats_.stop_signal};
  broadcast_vector(tp_, tail);
}

// The replica's other ranks: the leader's commands until its end, then its totals.
void StreamTargetRank::follow() {
  for (;;) {
    const std::vector<int64_t> cmd = broadcast_vector(tp_, {});
    if (cmd.empty() || cmd[0] < 0) break;
    compute(std::vector<int64_t>(cmd.begin() + 1, cmd.end()), std::vector<int>(cmd.size() - 1, -1),
            kStreamTrainTag, -1);
  }
  const std::vector<int64_t> tail = broadcast_vector(tp_, {});
  stats_.last_step = tail.at(0);
  stats_.stop_signal = static_cast<int>(tail.at(1));
}

}  // namespace

StreamTargetStats run_stream_target(MpiCommunicator& world, const StreamLayout& layout, MpiCommunicator& tp,
                                    const std::string& prepared_path, int64_t vocab_size,
                                    const TargetForward& forward, const TargetForwardBatch& forward_batch,
                                    int64_t batch_tokens, double log_every_s) {
  // Target ranks receive the trainers' signals too (Slurm signals every task): they keep running until the
  // trainers' last credit, which comes after the trainers' checkpoint.
  StopSignals stop_signals;
  StreamTargetRank rank(world, layout, tp, prepared_path, vocab_size, forward, forward_batch, batch_tokens,
                        log_every_s);
  return rank.run();
}

}  // namespace aerie
