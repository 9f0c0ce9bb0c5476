// aerie's version and the git commit it was built from (cmake/aerie_version.cmake writes them at build
// time), for `aerie --version` and the provenance every output records: the "aerie_version" attribute
// of prepared files and shards, the checkpoint and export metadata (docs/formats.md).
#pragma once
#include <string>

namespace aerie {

/// The release version, e.g. "0.1.0" (CMakeLists.txt project VERSION).
const char* aerie_version();
/// `git describe --always --dirty --abbrev=12` of the source tree at build time, or "unknown" (a source
/// tree without .git, or no git).
const char* aerie_git_commit();
/// "0.1.0+<commit>": what the outputs record.
std::string aerie_version_string();

}  // namespace aerie
