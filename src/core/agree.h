// Agreement on failure across the ranks of a collective step: a rank whose part of a collective
// operation failed must not unwind into the next collective (a destructor's H5Fclose) while its peers go on
// to another one (the next write's MPI_Allreduce): both would wait forever. Each collective step is followed
// by one all-reduce of a failure flag, and on a failure every rank throws aerie::CollectiveError together,
// with the message of the rank that failed, so main() ends the job with status 1 and that message once.
#pragma once
#include <mpi.h>

#include <functional>
#include <string>

namespace aerie {

/// Collective over `comm`: every rank passes what went wrong on it ("" when nothing did). Returns when no
/// rank failed; otherwise every rank throws aerie::CollectiveError with the message of the lowest failing
/// rank, followed by "(on rank R of N)" when that is not rank 0.
void agree_on_failure(MPI_Comm comm, const std::string& error);

/// Runs `step`, a collective step over `comm`, on every rank, then agree_on_failure with the what() of an
/// exception `step` threw (std::exception of any kind: an aerie::Error, std::bad_alloc, ...). An
/// aerie::CollectiveError from `step` (a nested agreement: every rank threw it) propagates unchanged.
void agree_on_step(MPI_Comm comm, const std::function<void()>& step);

}  // namespace aerie
