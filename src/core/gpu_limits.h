// What the CUDA kernels may plan for on a GPU (its compute capability, the shared memory one block may take,
// whether it runs wgmma), and AERIE_CUDA_EMULATE, which makes an H100 / H200 plan as another GPU does: the
// kernel paths and tile configurations of a user's card (an RTX PRO 6000's sm_120, a B200's sm_100) run and are
// tested on the Hopper GPUs we have. The table holds what CUDA reports for each card
// (cudaDevAttrMaxSharedMemoryPerBlockOptin; CUDA C++ Programming Guide, "Technical Specifications per Compute
// Capability"). CPU-only code: it compiles and is tested without the CUDA backend.
#pragma once
#include <cstdint>
#include <optional>
#include <string>

namespace aerie::cuda {

struct GpuLimits {
  int major = 0, minor = 0;     // compute capability
  int64_t smem_per_block = 0;   // bytes of shared memory one block may take (with the opt-in)
  bool wgmma = false;           // runs the sm_90a wgmma kernels (compute capability 9.0 exactly)
  std::string emulated;         // "sm_120" when AERIE_CUDA_EMULATE made these limits, else ""
  int64_t smem_per_sm = 0;      // bytes of shared memory one SM holds, shared by the blocks resident on it (0: unknown)
  /// The shared-memory carveout (cudaFuncAttributePreferredSharedMemoryCarveout, percent of the real SM's) that
  /// leaves an SM of this GPU no more than one of the emulated GPU holds, so that as many blocks share an SM as
  /// there (an H100's SM holds 228 KiB, an RTX PRO 6000's 100 KiB: two blocks of 96 KiB on the one, one on the
  /// other); -1 (the driver's default) when nothing is emulated or the real SM holds no more.
  int carveout_percent = -1;
};

/// The name of the setting: AERIE_CUDA_EMULATE=sm_80 | sm_86 | sm_89 | sm_90 | sm_100 | sm_120.
inline constexpr const char* kEmulateEnv = "AERIE_CUDA_EMULATE";

/// The limits of the GPU family `name` names ("sm_120", "120" or "12.0" alike; sm_100 also as "sm_100a"),
/// or nullopt when `name` is null or empty. sm_80: 163 KiB per block, 164 KiB per SM; sm_86, sm_89, sm_120: 99 and
/// 100 KiB; sm_90, sm_100: 227 and 228 KiB; wgmma on sm_90 only (sm_100 has tcgen05 instead, sm_120 neither).
/// Throws aerie::Error naming AERIE_CUDA_EMULATE and the names it takes for any other value.
std::optional<GpuLimits> emulated_gpu_limits(const char* name);

/// What a kernel may plan for on a GPU with limits `real` when `emulated` is set: the emulated family's
/// compute capability, wgmma only where both have it, the smaller shared memory per block and per SM of the two
/// (an H100 cannot lend more than it has), and the carveout that caps the real SM at the emulated one's
/// (ceil(100 emulated / real) percent; -1 where the real SM's size is unknown or not larger). `real` unchanged
/// without `emulated`.
GpuLimits apply_emulation(const GpuLimits& real, const std::optional<GpuLimits>& emulated);

/// Whether a W8A8 block-FP8 GEMM (--fp8-gemm) on a GPU of limits `l` takes aerie's mma.sync e4m3 kernel
/// (kernels/cuda/gemm_fp8_mma.cu) rather than cuBLASLt's block-scaled FP8: AERIE_FP8_GEMM_KERNEL (`setting`) "mma" or "mma128",
/// or unset on a family whose cuBLASLt has no block-scaled FP8 (not sm_90 or sm_100; sm_89 and later have e4m3
/// mma.sync). That kernel is slower than BF16 GEMMs today (docs/performance.md), so the target says so when it
/// loads.
bool fp8_gemm_runs_mma(const GpuLimits& l, const std::string& setting);

/// The current device's limits with AERIE_CUDA_EMULATE applied (read at every call, so that a test may set it;
/// the device's own attributes are queried once per device and thread). Throws aerie::Error in a build without
/// the CUDA backend or on a CUDA error.
GpuLimits gpu_limits();

}  // namespace aerie::cuda
