// Placeholder until the job is built.
#include "core/error.h"
#include "jobs/jobs.h"

namespace aerie::jobs {
int export_draft(const std::vector<std::string>&) { AERIE_THROW("export: not implemented yet"); }
}  // namespace aerie::jobs
