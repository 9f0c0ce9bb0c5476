#include "core/memory.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <iomanip>
#include <sstream>
#include <thread>

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

int cpu_cores_online() { return std::max(1u, std::thread::hardware_concurrency()); }

int cpu_cores_allowed() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof(set), &set) != 0) return cpu_cores_online();
  return std::max(1, CPU_COUNT(&set));
}

std::string single_core_warning(int allowed, int online) {
  if (allowed > 1 || online <= 1) return "";
  std::ostringstream os;
  os << "this rank may run on 1 CPU core of the machine's " << online
     << " (its affinity: mpirun binds each rank to one core at -np 1 or 2, Slurm gives it --cpus-per-task): the shard "
        "reader and writer threads take turns with the thread that launches the GPU's kernels, and extract and train "
        "run slower; give each rank several cores: mpirun --bind-to none (or --map-by slot:PE=N), Slurm "
        "--cpus-per-task N (slurm/submit's cpus-per-task)";
  return os.str();
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
