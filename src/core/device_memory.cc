#include "core/device_memory.h"

#include "core/cuda_check.h"
#include "core/device.h"

namespace aerie::cuda {

#ifdef AERIE_WITH_CUDA

std::optional<DeviceMemory> device_memory() {
  size_t free_b = 0, total_b = 0;
  if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) return std::nullopt;
  return DeviceMemory{static_cast<int64_t>(free_b), static_cast<int64_t>(total_b)};
}

std::optional<int64_t> pool_high_water_bytes() {
  cudaMemPool_t pool = nullptr;
  unsigned long long high = 0;  // NOLINT(runtime/int): the CUDA API's type
  if (cudaDeviceGetDefaultMemPool(&pool, current_device()) != cudaSuccess ||
      cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemHigh, &high) != cudaSuccess)
    return std::nullopt;
  return static_cast<int64_t>(high);
}

#else  // CPU-only build

std::optional<DeviceMemory> device_memory() { return std::nullopt; }
std::optional<int64_t> pool_high_water_bytes() { return std::nullopt; }

#endif

}  // namespace aerie::cuda
