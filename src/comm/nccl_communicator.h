// NCCL communicator on device (CUDA) tensors, for tensor-parallel activations and data-parallel gradients
// on GPUs: the Communicator interface of comm/communicator.h, plus an all-reduce on a caller's stream to
// overlap the gradient reduction with the backward pass. One GPU per rank (NCCL refuses two ranks on
// one GPU). Model after nccl-tests / TensorRT-LLM: a unique id from rank 0, broadcast over MPI,
// ncclCommInitRank on every rank.
//
// The header compiles in every build; without the CUDA backend the constructor throws aerie::Error.
#pragma once
#include <memory>

#include "comm/communicator.h"
#include "core/device.h"

namespace aerie {

/// This rank's index among the ranks of its node (MPI_Comm_split_type(MPI_COMM_WORLD,
/// MPI_COMM_TYPE_SHARED), ordered by world rank): the GPU it uses. The first call of local_rank() or
/// local_size() is collective over MPI_COMM_WORLD (every rank must make it); later calls are cached.
int local_rank();
/// The number of ranks on this rank's node (same first-call rule as local_rank()).
int local_size();
/// The number of ranks of `c` on this rank's node (MPI_Comm_split_type of c's communicator; not cached):
/// e.g. the training ranks of a streaming job, whose other ranks run the target. Collective over `c`.
int node_size(const MpiCommunicator& c);

/// Collectives over the ranks of an MpiCommunicator on CUDA tensors (F32, BF16, I32, I64; gather and
/// broadcast any dtype). Semantics as Communicator documents, with these differences:
///  - every op is queued on the calling thread's current stream (cuda::current_stream()) and returns once
///    queued: the result is there for later work on that stream; the host sees it after a synchronize
///    (Tensor::to_device(CPU) does one). barrier() is the exception: it blocks (see there);
///  - BF16 sums are NCCL's: each reduction step adds in fp32 and rounds to bf16, so with more than two
///    ranks the result may differ by a few bf16 ulps from MpiCommunicator's (one rounding of an fp32 sum).
///    All-reduce an F32 copy where one rounding matters;
///  - all_reduce_max also takes BF16 (exact).
/// Every rank must issue the same collectives in the same order. Errors (wrong device or dtype, an NCCL
/// failure) throw aerie::Error with ncclGetErrorString, the op, the tensor's dtype and shape, and the rank.
class NcclCommunicator : public Communicator {
 public:
  /// Collective over `mpi`'s ranks (and, on the first use of local_rank(), over MPI_COMM_WORLD): selects
  /// this rank's GPU, cuda::select_device(local_rank()), then rank 0 of `mpi` makes an ncclUniqueId, MPI
  /// broadcasts it, and every rank calls ncclCommInitRank. Throws aerie::Error without the CUDA backend,
  /// without a GPU, or when NCCL fails (e.g. two ranks on one GPU).
  explicit NcclCommunicator(const MpiCommunicator& mpi);
  /// ncclCommFinalize + ncclCommDestroy: like construction, all ranks must destroy it together.
  ~NcclCommunicator() override;
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void all_reduce_sum(Tensor& t) override;
  /// The sum queued on a side stream of this communicator (made at the first call) after the current
  /// stream's work so far; wait() makes the current stream wait for it, so that the current stream's work
  /// queued in between runs beside the reduction. Every start goes to the one side stream, so started
  /// sums run in the order started (no blocking collective in between: Communicator's rule).
  std::unique_ptr<PendingCollective> start_all_reduce_sum(Tensor& t) override;
  void all_reduce_max(Tensor& t) override;
  void all_gather(const Tensor& in, Tensor& out) override;
  void broadcast(Tensor& t, int root) override;
  /// Returns when every rank has reached the barrier and this rank's current stream has finished all
  /// work queued before it (a one-element all-reduce, then a stream synchronize).
  void barrier() override;

  /// In-place sum of t over the group, queued on `s` (a stream of the current device, e.g. from
  /// cuda::create_stream()) after everything queued so far on the current stream (an event orders them),
  /// so that a gradient can be reduced while the backward pass goes on. Returns at once; t holds the sum
  /// once `s` is synchronised (cuda::synchronize(s)). t must stay alive and unchanged until then.
  void all_reduce_sum_async(Tensor& t, cuda::Stream s);

 private:
  struct Impl;  // holds the ncclComm_t (keeps nccl.h out of this header)
  std::unique_ptr<Impl> impl_;
  int rank_ = 0, size_ = 1;
};

}  // namespace aerie
