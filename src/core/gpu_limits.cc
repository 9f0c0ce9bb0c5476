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
      {"80", "8.0", {8, 0, 163 * kKiB, false, "", 164 * kKiB}},
      {"86", "8.6", {8, 6, 99 * kKiB, false, "", 100 * kKiB}},
      {"89", "8.9", {8, 9, 99 * kKiB, false, "", 100 * kKiB}},
      {"90", "9.0", {9, 0, 227 * kKiB, true, "", 228 * kKiB}},
      {"100", "10.0", {10, 0, 227 * kKiB, false, "", 228 * kKiB}},
      {"120", "12.0", {12, 0, 99 * kKiB, false, "", 100 * kKiB}},
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
  l.smem_per_sm = real.smem_per_sm > 0 ? std::min(real.smem_per_sm, emulated->smem_per_sm) : emulated->smem_per_sm;
  l.carveout_percent = -1;
  if (real.smem_per_sm > emulated->smem_per_sm)
    l.carveout_percent = static_cast<int>((100 * emulated->smem_per_sm + real.smem_per_sm - 1) / real.smem_per_sm);
  return l;
}

bool fp8_gemm_runs_mma(const GpuLimits& l, const std::string& setting) {
  if (setting == "mma" || setting == "mma128") return true;
  if (!setting.empty()) return false;
  return l.major != 9 && l.major != 10 && l.major * 10 + l.minor >= 89;
}

}  // namespace aerie::cuda
