// Placeholder until the job is built.
#include "core/error.h"
#include "jobs/jobs.h"

namespace aerie::jobs {
int generate(const std::vector<std::string>&) { AERIE_THROW("generate: not implemented yet"); }
}  // namespace aerie::jobs
