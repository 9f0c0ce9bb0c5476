#include "comm/communicator.h"

#include <cmath>
#include <string>

namespace aerie {

void check_mpi(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  AERIE_THROW("MPI call " << what << " failed: " << std::string(msg, static_cast<size_t>(len)));
}

namespace {
MPI_Datatype mpi_type(DType dt) {
  switch (dt) {
    case DType::F32: return MPI_FLOAT;
    case DType::I32: return MPI_INT32_T;
    case DType::I64: return MPI_INT64_T;
    case DType::U8: return MPI_UINT8_T;
    case DType::BF16: return MPI_UINT16_T;
    case DType::F16: return MPI_UINT16_T;  // moved as bits only (no F16 sum: the reductions reject it)
    case DType::F8E4M3: return MPI_UINT8_T;  // the same
  }
  return MPI_BYTE;
}
void check_host(const Tensor& t, const char* what) {
  AERIE_CHECK(t.device() == Device::CPU, what << ": MpiCommunicator needs host tensors, got "
                                              << device_name(t.device()));
}
}  // namespace

std::unique_ptr<MpiCommunicator> MpiCommunicator::world() {
  return std::make_unique<MpiCommunicator>(MPI_COMM_WORLD, false);
}

MpiCommunicator::MpiCommunicator(MPI_Comm comm, bool owned) : comm_(comm), owned_(owned) {
  check_mpi(MPI_Comm_rank(comm_, &rank_), "MPI_Comm_rank");
  check_mpi(MPI_Comm_size(comm_, &size_), "MPI_Comm_size");
}

MpiCommunicator::~MpiCommunicator() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (owned_ && !finalized) MPI_Comm_free(&comm_);
}

std::unique_ptr<MpiCommunicator> MpiCommunicator::split(int color, int key) const {
  MPI_Comm out;
  check_mpi(MPI_Comm_split(comm_, color, key, &out), "MPI_Comm_split");
  return std::make_unique<MpiCommunicator>(out, true);
}

void MpiCommunicator::all_reduce_sum(Tensor& t) {
  check_host(t, "all_reduce_sum");
  if (t.dtype() == DType::BF16) {
    Tensor f = t.to(DType::F32);
    all_reduce_sum(f);
    t.copy_from(f.to(DType::BF16));
    return;
  }
  AERIE_CHECK(t.dtype() != DType::U8 && t.dtype() != DType::F8E4M3,
              "all_reduce_sum: " << dtype_name(t.dtype()) << " is not supported");
  check_mpi(MPI_Allreduce(MPI_IN_PLACE, t.raw(), static_cast<int>(t.numel()), mpi_type(t.dtype()),
                          MPI_SUM, comm_),
            "MPI_Allreduce(sum)");
}

namespace {
struct DonePending final : PendingCollective {
  void wait() override {}
};

// An MPI_Request of a started collective; the destructor completes one never waited for.
struct MpiPending final : PendingCollective {
  MPI_Request req = MPI_REQUEST_NULL;
  ~MpiPending() override {
    if (req != MPI_REQUEST_NULL) MPI_Wait(&req, MPI_STATUS_IGNORE);
  }
  void wait() override { check_mpi(MPI_Wait(&req, MPI_STATUS_IGNORE), "MPI_Wait(MPI_Iallreduce sum)"); }
};
}  // namespace

std::unique_ptr<PendingCollective> Communicator::start_all_reduce_sum(Tensor& t) {
  all_reduce_sum(t);
  return std::make_unique<DonePending>();
}

ModeledCommunicator::ModeledCommunicator(int size, int rank, double bus_bytes_per_s, double latency_s)
    : size_(size), rank_(rank), bus_bytes_per_s_(bus_bytes_per_s), latency_s_(latency_s) {
  AERIE_CHECK(size >= 2 && rank >= 0 && rank < size,
              "ModeledCommunicator: rank " << rank << " of " << size << " ranks (a modeled group has 2 or more)");
  AERIE_CHECK(std::isfinite(bus_bytes_per_s) && bus_bytes_per_s > 0 && std::isfinite(latency_s) && latency_s >= 0,
              "ModeledCommunicator: bus bandwidth " << bus_bytes_per_s << " B/s and latency " << latency_s
                                                    << " s must be positive and not negative");
}

void ModeledCommunicator::add(double bus_bytes) {
  seconds_ += latency_s_ + bus_bytes / bus_bytes_per_s_;
  ++collectives_;
}

void ModeledCommunicator::all_reduce_sum(Tensor& t) {
  add(2.0 * (size_ - 1) / size_ * static_cast<double>(t.nbytes()));
}

void ModeledCommunicator::all_gather(const Tensor& in, Tensor& out) {
  AERIE_CHECK(out.numel() == in.numel() * size_ && out.dtype() == in.dtype(),
              "ModeledCommunicator::all_gather: out has " << out.numel() << " elements, not " << size_ << " x "
                                                          << in.numel() << " of in's dtype");
  const Tensor rows = out.reshape({size_, in.numel()});
  const Tensor one = in.reshape({1, in.numel()});
  for (int r = 0; r < size_; ++r) {
    Tensor slot = rows.slice(r, r + 1);
    slot.copy_from(one);
  }
  add(static_cast<double>(size_ - 1) / size_ * static_cast<double>(out.nbytes()));
}

std::unique_ptr<PendingCollective> MpiCommunicator::start_all_reduce_sum(Tensor& t) {
  check_host(t, "start_all_reduce_sum");
  if (t.dtype() != DType::F32 && t.dtype() != DType::I32 && t.dtype() != DType::I64)
    return Communicator::start_all_reduce_sum(t);  // BF16 (a converted copy) and the refusals
  auto p = std::make_unique<MpiPending>();
  check_mpi(MPI_Iallreduce(MPI_IN_PLACE, t.raw(), static_cast<int>(t.numel()), mpi_type(t.dtype()), MPI_SUM, comm_,
                           &p->req),
            "MPI_Iallreduce(sum)");
  return p;
}

void MpiCommunicator::all_reduce_max(Tensor& t) {
  check_host(t, "all_reduce_max");
  AERIE_CHECK(t.dtype() == DType::F32 || t.dtype() == DType::I32 || t.dtype() == DType::I64,
              "all_reduce_max: unsupported dtype " << dtype_name(t.dtype()));
  check_mpi(MPI_Allreduce(MPI_IN_PLACE, t.raw(), static_cast<int>(t.numel()), mpi_type(t.dtype()),
                          MPI_MAX, comm_),
            "MPI_Allreduce(max)");
}

void MpiCommunicator::all_gather(const Tensor& in, Tensor& out) {
  check_host(in, "all_gather");
  AERIE_CHECK(out.numel() == in.numel() * size_ && out.dtype() == in.dtype(),
              "all_gather: output " << shape_str(out.shape()) << " does not hold " << size_ << " x "
                                    << shape_str(in.shape()));
  check_mpi(MPI_Allgather(in.raw(), static_cast<int>(in.numel()), mpi_type(in.dtype()), out.raw(),
                          static_cast<int>(in.numel()), mpi_type(in.dtype()), comm_),
            "MPI_Allgather");
}

void MpiCommunicator::broadcast(Tensor& t, int root) {
  check_host(t, "broadcast");
  check_mpi(MPI_Bcast(t.raw(), static_cast<int>(t.numel()), mpi_type(t.dtype()), root, comm_), "MPI_Bcast");
}

void MpiCommunicator::barrier() { check_mpi(MPI_Barrier(comm_), "MPI_Barrier"); }

void MpiCommunicator::send(const std::vector<int64_t>& v, int dest, int tag) {
  check_mpi(MPI_Send(v.data(), static_cast<int>(v.size()), MPI_INT64_T, dest, tag, comm_), "MPI_Send");
}

std::vector<int64_t> MpiCommunicator::recv(int src, int tag, int* actual_src) {
  MPI_Status st;
  check_mpi(MPI_Probe(src, tag, comm_, &st), "MPI_Probe");
  int n = 0;
  MPI_Get_count(&st, MPI_INT64_T, &n);
  std::vector<int64_t> v(static_cast<size_t>(n));
  check_mpi(MPI_Recv(v.data(), n, MPI_INT64_T, st.MPI_SOURCE, tag, comm_, MPI_STATUS_IGNORE), "MPI_Recv");
  if (actual_src) *actual_src = st.MPI_SOURCE;
  return v;
}

Mapping::Mapping(int world_rank_, int world_size_, int tp_)
    : world_rank(world_rank_), world_size(world_size_), tp(tp_) {
  AERIE_CHECK(tp >= 1, "--tp must be >= 1, got " << tp);
  AERIE_CHECK(world_size % tp == 0, "the number of ranks (" << world_size << ") is not a multiple of --tp "
                                                             << tp);
  tp_rank = world_rank % tp;
  dp = world_size / tp;
  dp_rank = world_rank / tp;
}

ParallelGroups ParallelGroups::create(int tp, const MpiCommunicator& base) {
  auto world = base.split(0, base.rank());
  Mapping map(world->rank(), world->size(), tp);
  auto tpc = world->split(map.dp_rank, map.tp_rank);
  auto dpc = world->split(map.tp_rank, map.dp_rank);
  return ParallelGroups{map, std::move(world), std::move(tpc), std::move(dpc)};
}

ParallelGroups ParallelGroups::create(int tp) {
  auto world = MpiCommunicator::world();
  Mapping map(world->rank(), world->size(), tp);
  auto tpc = world->split(map.dp_rank, map.tp_rank);
  auto dpc = world->split(map.tp_rank, map.dp_rank);
  return ParallelGroups{map, std::move(world), std::move(tpc), std::move(dpc)};
}

int32_t max_over_ranks(Communicator& c, int32_t v) {
  Tensor f = Tensor::from_vector<int32_t>({v}, {1});
  c.all_reduce_max(f);
  return f.data<int32_t>()[0];
}

void agree_on_refusal(Communicator& c, const std::string& job, const std::function<void()>& checks) {
  std::string refusal;
  try {
    checks();
  } catch (const Error& e) {
    refusal = e.what();
    if (refusal.empty()) refusal = "refused";
  }
  if (max_over_ranks(c, refusal.empty() ? 0 : 1) == 0) return;
  throw CollectiveError(refusal.empty() ? job + ": another rank refused (rank 0's log says why)" : refusal);
}

}  // namespace aerie
