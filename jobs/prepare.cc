// Placeholder until the job is built.
#include "core/error.h"
#include "jobs/jobs.h"

namespace aerie::jobs {
int prepare(const std::vector<std::string>&) { AERIE_THROW("prepare: not implemented yet"); }
}  // namespace aerie::jobs
