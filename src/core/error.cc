#include "core/error.h"

namespace aerie::detail {

void throw_error(const std::string& msg, const char* file, int line) {
  std::string f(file);
  auto pos = f.rfind("/src/");
  if (pos != std::string::npos) f = f.substr(pos + 1);
  throw Error(msg + " [" + f + ":" + std::to_string(line) + "]");
}

}  // namespace aerie::detail
