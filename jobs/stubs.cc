// Placeholders for jobs not yet built; each job's own file replaces its line here.
#include "core/error.h"
#include "jobs/jobs.h"

namespace aerie::jobs {
int prepare(const std::vector<std::string>&) { AERIE_THROW("prepare: not implemented yet"); }
int extract(const std::vector<std::string>&) { AERIE_THROW("extract: not implemented yet"); }
int vocab(const std::vector<std::string>&) { AERIE_THROW("vocab: not implemented yet"); }
int train(const std::vector<std::string>&) { AERIE_THROW("train: not implemented yet"); }
int export_draft(const std::vector<std::string>&) { AERIE_THROW("export: not implemented yet"); }
int eval(const std::vector<std::string>&) { AERIE_THROW("eval: not implemented yet"); }
int generate(const std::vector<std::string>&) { AERIE_THROW("generate: not implemented yet"); }
}  // namespace aerie::jobs
