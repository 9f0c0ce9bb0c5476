// The machine's memory, for checking a size against the memory it needs before allocating it (an
// absurd --draft-heads grew to 24 GB before the OOM killer, a config.json of 10^12 layers ended in
// std::bad_alloc naming nothing), and the CPU cores this process may run on.
#pragma once
#include <cstdint>
#include <string>

namespace aerie {

/// The host's memory available to a new allocation in bytes: MemAvailable of /proc/meminfo, else the
/// physical memory (sysconf); -1 when neither is known.
int64_t host_memory_bytes();

/// The CPU cores this process may run on (its affinity mask, sched_getaffinity: what mpirun's or Slurm's binding
/// left it), at least 1; the machine's core count where the mask cannot be read.
int cpu_cores_allowed();
/// The CPU cores of the machine (std::thread::hardware_concurrency), at least 1.
int cpu_cores_online();
/// A warning for a rank whose affinity allows one core on a machine of several, "" otherwise: its background threads
/// (the shard reader and writer, the prepared file's reader) then take turns with the thread that launches the GPU's
/// kernels, whose steps are launch-bound at short lengths; names the launchers' options that give it more.
std::string single_core_warning(int allowed, int online);

/// `bytes` for messages: "1.50 GiB" (a double: sizes computed before they are known to fit an int64).
std::string gib_text(double bytes);

}  // namespace aerie
