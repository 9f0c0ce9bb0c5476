// aerie's version (core/version.h); the values come from the generated aerie_version.h.
#include "core/version.h"

#include "aerie_version.h"

namespace aerie {

const char* aerie_version() { return AERIE_VERSION; }
const char* aerie_git_commit() { return AERIE_GIT_COMMIT; }
std::string aerie_version_string() { return std::string(AERIE_VERSION) + "+" + AERIE_GIT_COMMIT; }

}  // namespace aerie
