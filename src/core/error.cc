#include "core/error.h"

namespace aerie::detail {

void throw_error(const std::string& msg, const char* file, int line) {
  std::string f(file);
  // Repository-relative location (src/..., jobs/...), whatever the checkout's absolute path.
  for (const char* top : {"/src/", "/jobs/", "/tests/"}) {
    auto pos = f.rfind(top);
    if (pos != std::string::npos) {
      f = f.substr(pos + 1);
      break;
    }
  }
  throw Error(msg + " [" + f + ":" + std::to_string(line) + "]");
}

}  // namespace aerie::detail
