// Streaming training: the two sides of the protocol in stream.h.
#include "train/stream.h"

#include <chrono>
#include <climits>
#include <cstring>
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

StreamTargetStats run_stream_target(MpiCommunicator& world, const StreamLayout& layout, MpiCommunicator& tp,
                                    const std::string& prepared_path, int64_t vocab_size,
                                    const TargetForward& forward, const TargetForwardBatch& forward_batch,
                                    int64_t batch_tokens, double log_every_s) {
  const int wr = world.rank();
  const int replica = wr / layout.tp, R = layout.replicas();
  const bool leader = tp.rank() == 0;
  // Target ranks receive the trainers' signals too (Slurm signals every task): they keep running until the
  // trainers' last credit, which comes after the trainers' checkpoint.
  StopSignals stop_signals;
  const PreparedFile prepared(prepared_path);
  StreamPlan plan = StreamPlan::from_vector(
      broadcast_vector(tp, leader ? world.recv(layout.trainer(0), kStreamStartTag) : std::vector<int64_t>{}));
  AERIE_CHECK(plan.num_samples == prepared.num_samples(),
              "train (stream): the trainers count " << plan.num_samples << " samples, " << prepared_path << " holds "
                                                   << prepared.num_samples());
  AERIE_CHECK(plan.trainers == layout.trainers() && plan.queue >= 0 && plan.num_train >= 1 &&
                  plan.num_train + plan.num_heldout <= plan.num_samples,
              "train (stream): a bad plan from the trainers");
  DataSplit split;
  split.shards = {prepared_path};
  split.shard_sizes = {plan.num_samples};
  for (int64_t g = 0; g < plan.num_train; ++g) split.train.push_back(g);
  for (int64_t g = plan.num_train; g < plan.num_samples; ++g) split.eval.push_back(g);
  const bool has_steps = plan.start_step < plan.total_steps;
  std::unique_ptr<BatchOrder> order;
  if (has_steps) order = std::make_unique<BatchOrder>(split, plan.batch_size, plan.seed);

  StreamTargetStats stats;
  stats.last_step = plan.start_step - 1;
  bool signal_noted = false;
  auto note_signal = [&] {  // once: a signal that reached this rank alone does not stop the run
    if (signal_noted || StopSignals::received() == 0) return;
    signal_noted = true;
    AERIE_LOG(warning) << "train (target): world rank " << wr << " received signal " << StopSignals::received()
                       << "; the target's ranks end when the training ranks stop, which they do (with a checkpoint) "
                       << "on a signal of their own (Slurm signals every task; by hand, signal mpirun or a "
                       << "training rank)";
  };
  struct Pending {
    int64_t step;  // -1: held-out
    MPI_Request req;
    std::vector<uint8_t> buf;
  };
  std::deque<Pending> pending;
  auto progress_sends = [&] {  // lets MPI move the messages in flight (and frees the finished ones in order)
    while (!pending.empty()) {
      int done = 0;
      check_mpi(MPI_Test(&pending.front().req, &done, MPI_STATUS_IGNORE), "MPI_Test (stream)");
      if (!done) break;
      pending.pop_front();
    }
  };
  auto last_log = Clock::now();
  const auto started = Clock::now();
  int64_t logged_tokens = 0;
  auto log_rate = [&](bool final) {
    if (wr != 0 || (!final && since(last_log) < log_every_s)) return;
    const double dt = since(last_log), all = since(started);
    std::ostringstream os;
    os << std::fixed << std::setprecision(0) << "train (target): " << (final ? "done at" : "at") << " step "
       << stats.last_step + 1 << " of " << plan.total_steps << ", replica 0 forwarded " << stats.samples << " samples, "
       << (final ? static_cast<double>(stats.tokens) / std::max(all, 1e-9)
                 : static_cast<double>(stats.tokens - logged_tokens) / std::max(dt, 1e-9))
       << " tokens/s" << std::setprecision(1) << " (forward " << stats.forward_seconds << " s, waited for the trainers "
       << stats.wait_seconds << " s of " << all << " s)";
    AERIE_LOG(info) << os.str();
    last_log = Clock::now();
    logged_tokens = stats.tokens;
  };

  // Computes samples `gs` (the replica's, in order) and, on the leader, sends sample k to world rank
  // dest[k] with `tag`. Collective over the replica: the leader broadcasts the command [n, g_0 ..], which
  // the other ranks received before they call it.
  auto compute = [&](const std::vector<int64_t>& gs, const std::vector<int>& dest, int tag, int64_t step) {
    if (leader) {
      std::vector<int64_t> cmd = {static_cast<int64_t>(gs.size())};
      cmd.insert(cmd.end(), gs.begin(), gs.end());
      broadcast_vector(tp, cmd);
    }
    note_signal();
    const auto t0 = Clock::now();
    std::vector<std::vector<int32_t>> ids(gs.size());
    for (size_t k = 0; k < gs.size(); ++k) {
      std::vector<uint8_t> mask;
      prepared.read_tokens(gs[k], gs[k] + 1, ids[k], mask);
      AERIE_CHECK(!ids[k].empty(), "train (stream): prepared sample " << gs[k] << " of " << prepared_path << " is empty");
      if (vocab_size > 0)
        for (size_t t = 0; t < ids[k].size(); ++t)
          AERIE_CHECK(ids[k][t] >= 0 && ids[k][t] < vocab_size,
                      "train (stream): prepared sample " << gs[k] << " of " << prepared_path << " has id " << ids[k][t]
                                                         << " at position " << t << ", outside the target's vocabulary [0, "
                                                         << vocab_size << ")");
    }
    size_t k = 0;
    while (k < gs.size()) {
      // A group: consecutive samples up to batch_tokens rows (forward_batch), else one sample.
      size_t e = k + 1;
      int64_t rows = static_cast<int64_t>(ids[k].size());
      if (forward_batch && batch_tokens > 0)
        while (e < gs.size() && rows + static_cast<int64_t>(ids[e].size()) <= batch_tokens)
          rows += static_cast<int64_t>(ids[e++].size());
      Tensor aux, fin;
      if (e - k == 1 || !forward_batch) {
        forward(ids[k], aux, fin);
        e = k + 1;
      } else {
        forward_batch(std::vector<std::vector<int32_t>>(ids.begin() + static_cast<std::ptrdiff_t>(k),
                                                        ids.begin() + static_cast<std::ptrdiff_t>(e)),
                      aux, fin);
      }
      if (leader) {
        const Tensor ha = host_bf16(aux), hf = host_bf16(fin);
        int64_t r0 = 0;
        for (size_t j = k; j < e; ++j) {
          const auto T = static_cast<int64_t>(ids[j].size());
          Pending p{step, MPI_REQUEST_NULL, pack(gs[j], ha, hf, r0, T)};
          check_mpi(MPI_Isend(p.buf.data(), static_cast<int>(p.buf.size()), MPI_BYTE, dest[j], tag, world.handle(),
                              &p.req),
                    "MPI_Isend (stream)");
          pending.push_back(std::move(p));
          r0 += T;
          stats.tokens += T;
        }
        progress_sends();
      } else {
        for (size_t j = k; j < e; ++j) stats.tokens += static_cast<int64_t>(ids[j].size());
      }
      stats.samples += static_cast<int64_t>(e - k);
      k = e;
    }
    stats.forward_seconds += since(t0);
  };
  auto serve_heldout = [&] {
    std::vector<int64_t> gs;
    std::vector<int> dest;
    for (int64_t i = replica; i < plan.num_heldout; i += R) {
      gs.push_back(plan.num_train + i);
      dest.push_back(layout.trainer(static_cast<int>(i % plan.trainers)));
    }
    compute(gs, dest, kStreamHeldoutTag, -1);
  };

  if (leader) {
    int64_t credit = plan.start_step;  // the step whose credit comes next
    bool done = !has_steps;
    auto take_credit = [&] {
      const auto t0 = Clock::now();
      const std::vector<int64_t> c = world.recv(layout.trainer(0), kStreamCreditTag);
      stats.wait_seconds += since(t0);
      AERIE_CHECK(c.size() == 4 && c[0] == credit, "train (stream): the trainers' credit for step "
                                                       << (c.empty() ? -1 : c[0]) << " where step " << credit
                                                       << " was due");
      ++credit;
      if (c[1] != 0) serve_heldout();
      if (c[2] != 0) {
        done = true;
        stats.stop_signal = static_cast<int>(c[3]);
      }
    };
    for (int64_t s = plan.start_step; s < plan.total_steps && !done; ++s) {
      while (!done && credit < s - plan.queue) take_credit();
      if (done) break;
      const std::vector<int64_t> batch = order->batch(s);
      std::vector<int64_t> gs;
      std::vector<int> dest;
      for (size_t i = static_cast<size_t>(replica); i < batch.size(); i += static_cast<size_t>(R)) {
        gs.push_back(batch[i]);
        dest.push_back(layout.trainer(static_cast<int>(i % static_cast<size_t>(plan.trainers))));
      }
      compute(gs, dest, kStreamTrainTag, s);
      stats.last_step = s;
      log_rate(false);
    }
    while (!done) take_credit();
    for (int t = 0; t < layout.trainers(); ++t) world.send({stats.last_step}, layout.trainer(t), kStreamEndTag);
    for (Pending& p : pending) check_mpi(MPI_Wait(&p.req, MPI_STATUS_IGNORE), "MPI_Wait (stream)");
    pending.clear();
    broadcast_vector(tp, {-1});  // the replica's other ranks end
    std::vector<int64_t> tail = {stats.last_step, stats.stop_signal};
    broadcast_vector(tp, tail);
  } else {
    for (;;) {
      const std::vector<int64_t> cmd = broadcast_vector(tp, {});
      if (cmd.empty() || cmd[0] < 0) break;
      compute(std::vector<int64_t>(cmd.begin() + 1, cmd.end()), std::vector<int>(cmd.size() - 1, -1),
              kStreamTrainTag, -1);
    }
    const std::vector<int64_t> tail = broadcast_vector(tp, {});
    stats.last_step = tail.at(0);
    stats.stop_signal = static_cast<int>(tail.at(1));
  }
  log_rate(true);
  return stats;
}

}  // namespace aerie
