// What the current GPU's memory holds: the runtime's free and total bytes, and the high-water mark of
// the stream-ordered pool that device tensors are allocated from (core/device.h). For logs and for
// sizing: each query answers "unknown" (std::nullopt) rather than throwing, also in a CPU-only build (no
// AERIE_WITH_CUDA).
#pragma once
#include <cstdint>
#include <optional>

namespace aerie::cuda {

struct DeviceMemory {
  int64_t free_bytes = 0;   // not allocated by anyone on the device
  int64_t total_bytes = 0;  // the device's memory
};

/// The current device's free and total memory in bytes (cudaMemGetInfo); std::nullopt in a build
/// without the backend or when the runtime cannot answer (no device, no driver).
std::optional<DeviceMemory> device_memory();

/// The most bytes the current device's default memory pool (where Tensor allocates) has had allocated
/// at once since the process started (cudaMemPoolAttrUsedMemHigh); std::nullopt in a build without the
/// backend or when the runtime cannot answer.
std::optional<int64_t> pool_high_water_bytes();

}  // namespace aerie::cuda
