// Placeholder until the job is built.
#include "core/error.h"
#include "jobs/jobs.h"

namespace aerie::jobs {
int train(const std::vector<std::string>&) { AERIE_THROW("train: not implemented yet"); }
}  // namespace aerie::jobs
