// Placeholder until the job is built.
#include "core/error.h"
#include "jobs/jobs.h"

namespace aerie::jobs {
int vocab(const std::vector<std::string>&) { AERIE_THROW("vocab: not implemented yet"); }
}  // namespace aerie::jobs
