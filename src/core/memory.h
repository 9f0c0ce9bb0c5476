// The machine's memory, for checking a size against the memory it needs before allocating it (an
// absurd --draft-heads grew to 24 GB before the OOM killer, a config.json of 10^12 layers ended in
// std::bad_alloc naming nothing).
#pragma once
#include <cstdint>
#include <string>

namespace aerie {

/// The host's memory available to a new allocation in bytes: MemAvailable of /proc/meminfo, else the
/// physical memory (sysconf); -1 when neither is known.
int64_t host_memory_bytes();

/// `bytes` for messages: "1.50 GiB" (a double: sizes computed before they are known to fit an int64).
std::string gib_text(double bytes);

}  // namespace aerie
