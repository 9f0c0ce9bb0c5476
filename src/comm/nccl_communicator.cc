// NcclCommunicator (see nccl_communicator.h) and the node-local rank.
#include "comm/nccl_communicator.h"

#include <sstream>
#include <string>

#include "core/log.h"

#ifdef AERIE_WITH_CUDA
#include <cuda_runtime.h>
#include <nccl.h>
#endif

namespace aerie {

namespace {
struct LocalRanks {
  int rank = 0, size = 1;
};
const LocalRanks& local_ranks() {
  static const LocalRanks l = [] {
    MPI_Comm node;
    check_mpi(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node),
              "MPI_Comm_split_type(MPI_COMM_TYPE_SHARED)");
    LocalRanks r;
    MPI_Comm_rank(node, &r.rank);
    MPI_Comm_size(node, &r.size);
    MPI_Comm_free(&node);
    return r;
  }();
  return l;
}
}  // namespace

int local_rank() { return local_ranks().rank; }
int local_size() { return local_ranks().size; }

int node_size(const MpiCommunicator& c) {
  MPI_Comm node;
  check_mpi(MPI_Comm_split_type(c.handle(), MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node),
            "MPI_Comm_split_type(MPI_COMM_TYPE_SHARED)");
  int n = 1;
  MPI_Comm_size(node, &n);
  MPI_Comm_free(&node);
  return n;
}

#ifdef AERIE_WITH_CUDA

struct NcclCommunicator::Impl {
  ncclComm_t comm = nullptr;
  cudaStream_t side = nullptr;  // start_all_reduce_sum's stream, made at its first use
};

/// Throws aerie::Error naming `what` with NCCL's error strings when `call` fails.
#define AERIE_NCCL_CHECK(call, what)                                                                 \
  do {                                                                                               \
    ncclResult_t r_ = (call);                                                                        \
    AERIE_CHECK(r_ == ncclSuccess, "NCCL " << what << " failed: " << ncclGetErrorString(r_) << " ("  \
                                           << ncclGetLastError(nullptr) << ")");                     \
  } while (0)

namespace {
/// The NCCL type of a reduction over t (F32, BF16, I32, I64); throws naming `what` otherwise.
ncclDataType_t reduce_type(const Tensor& t, const std::string& what) {
  if (t.dtype() == DType::F32) return ncclFloat32;
  if (t.dtype() == DType::BF16) return ncclBfloat16;
  if (t.dtype() == DType::I32) return ncclInt32;
  if (t.dtype() == DType::I64) return ncclInt64;
  AERIE_THROW(what << ": reductions take F32, BF16, I32 or I64");
}
cudaStream_t current() { return static_cast<cudaStream_t>(cuda::current_stream()); }

/// "op of F32 [2, 3] on rank r of n" for messages.
std::string describe(const char* op, const Tensor& t, int rank, int size) {
  std::ostringstream os;
  os << "NcclCommunicator::" << op << " of " << dtype_name(t.dtype()) << " " << shape_str(t.shape()) << " on rank "
     << rank << " of " << size;
  return os.str();
}
void check_cuda_tensor(const Tensor& t, const std::string& what) {
  AERIE_CHECK(t.device() == Device::CUDA, what << ": NcclCommunicator needs CUDA tensors, got a "
                                               << device_name(t.device()) << " tensor");
}
}  // namespace

NcclCommunicator::NcclCommunicator(const MpiCommunicator& mpi)
    : impl_(std::make_unique<Impl>()), rank_(mpi.rank()), size_(mpi.size()) {
  cuda::select_device(local_rank());
  ncclUniqueId id{};
  if (rank_ == 0) AERIE_NCCL_CHECK(ncclGetUniqueId(&id), "ncclGetUniqueId");
  check_mpi(MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, mpi.handle()), "MPI_Bcast of the ncclUniqueId");
  AERIE_NCCL_CHECK(ncclCommInitRank(&impl_->comm, size_, id, rank_),
                   "ncclCommInitRank (rank " << rank_ << " of " << size_ << ", GPU " << cuda::current_device()
                                             << "; NCCL needs one GPU per rank)");
}

NcclCommunicator::~NcclCommunicator() {
  if (impl_ && impl_->side) {
    cudaStreamSynchronize(impl_->side);
    cudaStreamDestroy(impl_->side);
  }
  if (!impl_ || !impl_->comm) return;
  ncclResult_t r = ncclCommFinalize(impl_->comm);
  if (r == ncclSuccess) r = ncclCommDestroy(impl_->comm);
  if (r != ncclSuccess) AERIE_LOG(warning) << "NCCL communicator teardown failed: " << ncclGetErrorString(r);
}

void NcclCommunicator::all_reduce_sum(Tensor& t) {
  const std::string what = describe("all_reduce_sum", t, rank_, size_);
  check_cuda_tensor(t, what);
  const ncclDataType_t type = reduce_type(t, what);
  if (t.numel() == 0) return;
  AERIE_NCCL_CHECK(ncclAllReduce(t.raw(), t.raw(), static_cast<size_t>(t.numel()), type, ncclSum, impl_->comm,
                                 current()),
                   what);
}

void NcclCommunicator::all_reduce_max(Tensor& t) {
  const std::string what = describe("all_reduce_max", t, rank_, size_);
  check_cuda_tensor(t, what);
  const ncclDataType_t type = reduce_type(t, what);
  if (t.numel() == 0) return;
  AERIE_NCCL_CHECK(ncclAllReduce(t.raw(), t.raw(), static_cast<size_t>(t.numel()), type, ncclMax, impl_->comm,
                                 current()),
                   what);
}

void NcclCommunicator::all_gather(const Tensor& in, Tensor& out) {
  const std::string what = describe("all_gather", in, rank_, size_);
  check_cuda_tensor(in, what + " (in)");
  check_cuda_tensor(out, what + " (out)");
  AERIE_CHECK(out.numel() == in.numel() * size_ && out.dtype() == in.dtype(),
              what << ": output " << dtype_name(out.dtype()) << " " << shape_str(out.shape()) << " does not hold "
                   << size_ << " x " << shape_str(in.shape()));
  if (in.numel() == 0) return;
  // A byte copy: any dtype.
  AERIE_NCCL_CHECK(ncclAllGather(in.raw(), out.raw(), in.nbytes(), ncclUint8, impl_->comm, current()), what);
}

void NcclCommunicator::broadcast(Tensor& t, int root) {
  const std::string what = describe("broadcast", t, rank_, size_);
  check_cuda_tensor(t, what);
  AERIE_CHECK(root >= 0 && root < size_, what << ": root " << root << " is not a rank of the group");
  if (t.numel() == 0) return;
  AERIE_NCCL_CHECK(ncclBroadcast(t.raw(), t.raw(), t.nbytes(), ncclUint8, root, impl_->comm, current()), what);
}

void NcclCommunicator::barrier() {
  Tensor token = Tensor::zeros({1}, DType::I32, Device::CUDA);
  AERIE_NCCL_CHECK(ncclAllReduce(token.raw(), token.raw(), 1, ncclInt32, ncclSum, impl_->comm, current()),
                   "NcclCommunicator::barrier on rank " << rank_ << " of " << size_);
  cuda::synchronize();
}

void NcclCommunicator::all_reduce_sum_async(Tensor& t, cuda::Stream s) {
  const std::string what = describe("all_reduce_sum_async", t, rank_, size_);
  check_cuda_tensor(t, what);
  const ncclDataType_t type = reduce_type(t, what);
  AERIE_CHECK(s != nullptr, what << ": no stream given");
  if (t.numel() == 0) return;
  const auto stream = static_cast<cudaStream_t>(s);
  if (stream != current()) {  // s waits for the work queued so far on the current stream (t's producer)
    cudaEvent_t ev = nullptr;
    cudaError_t e = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
    if (e == cudaSuccess) e = cudaEventRecord(ev, current());
    if (e == cudaSuccess) e = cudaStreamWaitEvent(stream, ev, 0);
    if (ev) cudaEventDestroy(ev);  // released once the recorded work is done
    AERIE_CHECK(e == cudaSuccess, what << ": ordering after the current stream: " << cudaGetErrorString(e));
  }
  AERIE_NCCL_CHECK(ncclAllReduce(t.raw(), t.raw(), static_cast<size_t>(t.numel()), type, ncclSum, impl_->comm,
                                 stream),
                   what);
}

namespace {
// The event recorded on the side stream after a started all-reduce; wait() makes the current stream wait on it.
struct NcclPending final : PendingCollective {
  cudaEvent_t done = nullptr;
  std::string what;
  ~NcclPending() override {
    if (!done) return;
    cudaStreamWaitEvent(current(), done, 0);
    cudaEventDestroy(done);
  }
  void wait() override {
    if (!done) return;
    cudaError_t e = cudaStreamWaitEvent(current(), done, 0);
    cudaEventDestroy(done);  // released once the recorded work is done
    done = nullptr;
    AERIE_CHECK(e == cudaSuccess, what << ": the wait on its side stream: " << cudaGetErrorString(e));
  }
};
}  // namespace

std::unique_ptr<PendingCollective> NcclCommunicator::start_all_reduce_sum(Tensor& t) {
  auto p = std::make_unique<NcclPending>();
  p->what = describe("start_all_reduce_sum", t, rank_, size_);
  if (t.numel() == 0) return p;
  if (!impl_->side) {
    const cudaError_t e = cudaStreamCreateWithFlags(&impl_->side, cudaStreamNonBlocking);
    AERIE_CHECK(e == cudaSuccess, p->what << ": creating its side stream: " << cudaGetErrorString(e));
  }
  all_reduce_sum_async(t, impl_->side);  // ordered after the current stream's work so far (t's producer)
  cudaError_t e = cudaEventCreateWithFlags(&p->done, cudaEventDisableTiming);
  if (e == cudaSuccess) e = cudaEventRecord(p->done, impl_->side);
  AERIE_CHECK(e == cudaSuccess, p->what << ": recording its end on the side stream: " << cudaGetErrorString(e));
  return p;
}

#else  // CPU-only build: the interface exists, nothing can build one.

struct NcclCommunicator::Impl {};

namespace {
[[noreturn]] void no_nccl(const char* f) {
  AERIE_THROW("NcclCommunicator::" << f << ": aerie was built without the CUDA backend (no NCCL)");
}
}  // namespace

NcclCommunicator::NcclCommunicator(const MpiCommunicator&) { no_nccl("NcclCommunicator"); }
NcclCommunicator::~NcclCommunicator() = default;
void NcclCommunicator::all_reduce_sum(Tensor&) { no_nccl("all_reduce_sum"); }
void NcclCommunicator::all_reduce_max(Tensor&) { no_nccl("all_reduce_max"); }
void NcclCommunicator::all_gather(const Tensor&, Tensor&) { no_nccl("all_gather"); }
void NcclCommunicator::broadcast(Tensor&, int) { no_nccl("broadcast"); }
void NcclCommunicator::barrier() { no_nccl("barrier"); }
void NcclCommunicator::all_reduce_sum_async(Tensor&, cuda::Stream) { no_nccl("all_reduce_sum_async"); }
std::unique_ptr<PendingCollective> NcclCommunicator::start_all_reduce_sum(Tensor&) {
  no_nccl("start_all_reduce_sum");
}

#endif

}  // namespace aerie
