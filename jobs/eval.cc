// Placeholder until the job is built.
#include "core/error.h"
#include "jobs/jobs.h"

namespace aerie::jobs {
int eval(const std::vector<std::string>&) { AERIE_THROW("eval: not implemented yet"); }
}  // namespace aerie::jobs
