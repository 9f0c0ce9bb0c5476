// Communicators: the interface every backend implements (MPI on host buffers here; NCCL on device
// buffers in the CUDA build), and the tensor/data-parallel mapping of world ranks.
// Model after TensorRT-LLM's mpiUtils: an RAII, movable MPI communicator with split(color, key).
#pragma once
#include <mpi.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace aerie {

/// A started collective (Communicator::start_all_reduce_sum). wait() returns once the result is in the
/// tensor for the caller's later work (on a GPU: for work queued on the current stream after the call);
/// it must be called exactly once, before the tensor is read or written again. Destroying a handle that
/// was not waited for waits (errors are then dropped).
class PendingCollective {
 public:
  virtual ~PendingCollective() = default;
  virtual void wait() = 0;
};

/// Collective operations over a group of ranks. Every rank of the group must call the same
/// collectives in the same order. Errors of the transport throw aerie::Error naming the call.
class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  /// In-place sum over the group. F32, BF16 (summed in fp32, rounded once), I32, I64.
  virtual void all_reduce_sum(Tensor& t) = 0;
  /// all_reduce_sum(t), started: the caller computes something else and then calls wait() on the handle
  /// (the tensor-parallel forward's overlap of one micro-batch's all-reduce with the other's compute).
  /// Same dtypes and result as all_reduce_sum. t must stay alive and untouched until wait(). Started
  /// collectives complete in the order they were started; every rank starts the same ones in the same
  /// order, and issues no blocking collective of this communicator while one is started and not waited
  /// for (NCCL's would run on another stream, in an order the ranks need not share). This default runs
  /// all_reduce_sum at once (no overlap) and returns a finished handle.
  virtual std::unique_ptr<PendingCollective> start_all_reduce_sum(Tensor& t);
  /// In-place max over the group (F32, I32, I64).
  virtual void all_reduce_max(Tensor& t) = 0;
  /// out[r * in.numel() + i] = in_r[i]: the inputs of all ranks concatenated along dim 0 in rank
  /// order. `out` has size() * in.numel() elements and in's dtype.
  virtual void all_gather(const Tensor& in, Tensor& out) = 0;
  /// Copies root's tensor into every rank's `t` (same shape and dtype everywhere).
  virtual void broadcast(Tensor& t, int root) = 0;
  virtual void barrier() = 0;
};

/// MPI communicator on host (CPU) buffers. Owns its MPI_Comm (freed on destruction) unless it wraps
/// MPI_COMM_WORLD.
class MpiCommunicator : public Communicator {
 public:
  /// The world communicator (MPI must be initialised).
  static std::unique_ptr<MpiCommunicator> world();
  explicit MpiCommunicator(MPI_Comm comm, bool owned);
  ~MpiCommunicator() override;
  MpiCommunicator(const MpiCommunicator&) = delete;
  MpiCommunicator& operator=(const MpiCommunicator&) = delete;

  /// MPI_Comm_split: ranks with the same color form a group, ordered by key.
  std::unique_ptr<MpiCommunicator> split(int color, int key) const;
  MPI_Comm handle() const { return comm_; }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void all_reduce_sum(Tensor& t) override;
  /// MPI_Iallreduce for F32, I32 and I64 (its progress is the MPI library's: Open MPI moves a started
  /// collective on inside later MPI calls and in the wait); BF16 through F32 at once, as all_reduce_sum.
  std::unique_ptr<PendingCollective> start_all_reduce_sum(Tensor& t) override;
  void all_reduce_max(Tensor& t) override;
  void all_gather(const Tensor& in, Tensor& out) override;
  void broadcast(Tensor& t, int root) override;
  void barrier() override;

  /// Point-to-point helpers for work queues (rank 0 handing out chunks): a vector of int64.
  void send(const std::vector<int64_t>& v, int dest, int tag);
  std::vector<int64_t> recv(int src, int tag, int* actual_src = nullptr);

 private:
  MPI_Comm comm_;
  bool owned_;
  int rank_ = 0, size_ = 1;
};

/// A group of one rank (no MPI): every collective leaves its tensors as they are (all_gather copies). For work
/// a rank does alone: benchmarks, and aerie calibrate's draft step (one rank's share of a data-parallel step).
class SelfCommunicator : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  void all_reduce_sum(Tensor&) override {}
  void all_reduce_max(Tensor&) override {}
  void all_gather(const Tensor& in, Tensor& out) override { out.copy_from(in); }
  void broadcast(Tensor&, int) override {}
  void barrier() override {}
};

/// Rank `rank` of a tensor-parallel group of `size` ranks that are not there: one device runs one rank's share of
/// the target while the collectives are modeled, not run (aerie calibrate --model-tp, for a node this machine is
/// not). No data moves: all_reduce_sum / all_reduce_max leave the tensor as it is, all_gather writes `in` into every
/// rank's slice of `out`, broadcast and barrier do nothing; so the results are not the group's (timings with random
/// weights only). Each collective but barrier adds its modeled time to seconds(): latency_s + bytes on the bus /
/// bus_bytes_per_s, with nccl-tests' bus conventions (all-reduce, sum (started or not) or max: 2 (n - 1) / n of the
/// tensor's bytes; all-gather: (n - 1) / n of the output's; broadcast: the tensor's bytes), the way calibrate
/// reports a measured all-reduce.
class ModeledCommunicator : public Communicator {
 public:
  /// Throws aerie::Error unless size >= 2, 0 <= rank < size, bus_bytes_per_s > 0 and latency_s >= 0 (finite).
  ModeledCommunicator(int size, int rank, double bus_bytes_per_s, double latency_s);
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void all_reduce_sum(Tensor& t) override;
  void all_reduce_max(Tensor& t) override { all_reduce_sum(t); }  // the same bytes; the tensor left as it is
  /// Throws aerie::Error unless `out` has size() x in.numel() elements of in's dtype.
  void all_gather(const Tensor& in, Tensor& out) override;
  void broadcast(Tensor& t, int) override { add(static_cast<double>(t.nbytes())); }
  void barrier() override {}
  /// The modeled seconds of every collective so far, and their count.
  double seconds() const { return seconds_; }
  int64_t collectives() const { return collectives_; }

 private:
  void add(double bus_bytes);
  int size_, rank_;
  double bus_bytes_per_s_, latency_s_;
  double seconds_ = 0;
  int64_t collectives_ = 0;
};

/// Throws aerie::Error with the MPI error string when `rc` != MPI_SUCCESS.
void check_mpi(int rc, const char* what);

/// How world ranks map onto tensor-parallel (tp) groups and data-parallel (dp) replicas.
/// World rank w: tp_rank = w % tp, dp_rank = w / tp (consecutive ranks, i.e. the GPUs of one node,
/// share a tp group). world_size must be a multiple of tp.
struct Mapping {
  int world_rank = 0, world_size = 1;
  int tp = 1, tp_rank = 0;
  int dp = 1, dp_rank = 0;
  /// Throws aerie::Error if tp < 1 or world_size % tp != 0.
  Mapping(int world_rank, int world_size, int tp);
};

/// The communicators of one rank: world, its tp group and its dp group (same tp_rank across replicas).
struct ParallelGroups {
  Mapping map;
  std::unique_ptr<MpiCommunicator> world, tp, dp;
  /// Splits MPI_COMM_WORLD by `tp` (collective over the world).
  static ParallelGroups create(int tp);
  /// The same over the ranks of `base` (its rank and size in the place of the world's; `world` is a copy
  /// of base): e.g. the target's ranks of a streaming train job. Collective over base.
  static ParallelGroups create(int tp, const MpiCommunicator& base);
};

/// The largest of the ranks' `v` (collective over `c`: one all-reduce).
int32_t max_over_ranks(Communicator& c, int32_t v);

/// Runs `checks` (a job's refusals before its work starts: options against a checkpoint or table, inputs)
/// on every rank of `c`, which must be every rank of the job. Each rank checks the same files and options,
/// so a refusal is the same on every rank; the ranks agree on it (one all-reduce) and each throws
/// aerie::CollectiveError with its message, so main() ends the job with status 1 and the message once,
/// without MPI_Abort's banner on every rank. A rank that passed while another refused throws "`job`: another
/// rank refused (rank 0's log says why)". Errors other than aerie::Error propagate unchanged (no agreement).
void agree_on_refusal(Communicator& c, const std::string& job, const std::function<void()>& checks);

}  // namespace aerie
