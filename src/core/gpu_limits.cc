#include "core/gpu_limits.h"

#include <algorithm>
#include <cstdlib>

#include "core/error.h"

namespace aerie::cuda {

std::optional<GpuLimits> emulated_gpu_limits(const char* name) {
  if (name == nullptr || *name == '\0') return std::nullopt;
  std::string n = name;
  if (n.rfind("sm_", 0) == 0) n = n.substr(3);
  if (!n.empty() && n.back() == 'a') n.pop_back();  // sm_100a, sm_90a: the same limits
  constexpr int64_t kKiB = 1024;
  struct Row {
    const char *cc, *dotted;
    GpuLimits limits;
  };
  static const Row rows[] = {
      {"80", "8.0", {8, 0, 163 * kKiB, false, ""}},  {"86", "8.6", {8, 6, 99 * kKiB, false, ""}},
      {"89", "8.9", {8, 9, 99 * kKiB, false, ""}},   {"90", "9.0", {9, 0, 227 * kKiB, true, ""}},
      {"100", "10.0", {10, 0, 227 * kKiB, false, ""}}, {"120", "12.0", {12, 0, 99 * kKiB, false, ""}},
  };
  for (const Row& r : rows)
    if (n == r.cc || n == r.dotted) {
      GpuLimits l = r.limits;
      l.emulated = std::string("sm_") + r.cc;
      return l;
    }
  AERIE_THROW(kEmulateEnv << " must name a GPU family (sm_80, sm_86, sm_89, sm_90, sm_100, sm_120), got '" << name
                          << "'");
}

GpuLimits apply_emulation(const GpuLimits& real, const std::optional<GpuLimits>& emulated) {
  if (!emulated) return real;
  GpuLimits l = *emulated;
  l.wgmma = real.wgmma && emulated->wgmma;
  l.smem_per_block = std::min(real.smem_per_block, emulated->smem_per_block);
  return l;
}

}  // namespace aerie::cuda
