#include "core/agree.h"

#include <cstdint>
#include <exception>

#include "core/error.h"

namespace aerie {

void agree_on_failure(MPI_Comm comm, const std::string& error) {
  int rank = 0, size = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  int first = error.empty() ? size : rank;  // the lowest failing rank, or size when none failed
  AERIE_CHECK(MPI_Allreduce(MPI_IN_PLACE, &first, 1, MPI_INT, MPI_MIN, comm) == MPI_SUCCESS,
              "MPI_Allreduce of a failure flag failed");
  if (first == size) return;
  std::string msg = rank == first ? error : std::string();
  int64_t n = static_cast<int64_t>(msg.size());
  MPI_Bcast(&n, 1, MPI_INT64_T, first, comm);
  msg.resize(static_cast<size_t>(n));
  MPI_Bcast(msg.data(), static_cast<int>(n), MPI_CHAR, first, comm);
  if (first != 0) msg += " (on rank " + std::to_string(first) + " of " + std::to_string(size) + ")";
  throw CollectiveError(msg);
}

void agree_on_step(MPI_Comm comm, const std::function<void()>& step) {
  std::string error;
  try {
    step();
  } catch (const CollectiveError&) {
    throw;  // thrown by every rank together already (a nested agreement)
  } catch (const std::exception& e) {
    error = e.what();
    if (error.empty()) error = "failed";
  }
  agree_on_failure(comm, error);
}

}  // namespace aerie
