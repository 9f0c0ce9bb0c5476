#include "core/memory.h"

#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <iomanip>
#include <sstream>

namespace aerie {

int64_t host_memory_bytes() {
  std::ifstream in("/proc/meminfo");
  for (std::string line; std::getline(in, line);) {
    long long kib = 0;
    if (std::sscanf(line.c_str(), "MemAvailable: %lld kB", &kib) == 1 && kib > 0) return static_cast<int64_t>(kib) * 1024;
  }
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGE_SIZE);
  if (pages <= 0 || page <= 0) return -1;
  return static_cast<int64_t>(pages) * static_cast<int64_t>(page);
}

std::string gib_text(double bytes) {
  std::ostringstream os;
  const double g = bytes / (1024.0 * 1024.0 * 1024.0);
  if (g < 1e6)
    os << std::fixed << std::setprecision(2) << g << " GiB";
  else
    os << std::scientific << std::setprecision(2) << g << " GiB";
  return os.str();
}

}  // namespace aerie
