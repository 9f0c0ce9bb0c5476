// Placeholder until the job is built.
#include "core/error.h"
#include "jobs/jobs.h"

namespace aerie::jobs {
int extract(const std::vector<std::string>&) { AERIE_THROW("extract: not implemented yet"); }
}  // namespace aerie::jobs
