// Shared by the CUDA kernels (src/kernels/cuda/*.cu): error checks, the current stream, launch sizes,
// bf16/fp32 loads and warp/block reductions. Internal to src/kernels.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>

#include "core/device.h"
#include "core/error.h"
#include "core/gpu_limits.h"

/// Throws aerie::Error naming `what` when a CUDA runtime call fails.
#define AERIE_CUDA_CHECK(call, what)                                                                 \
  do {                                                                                               \
    cudaError_t err_ = (call);                                                                       \
    AERIE_CHECK(err_ == cudaSuccess, what << ": " << cudaGetErrorName(err_) << " ("                  \
                                          << cudaGetErrorString(err_) << ")");                       \
  } while (0)
/// After a <<<>>> launch: throws aerie::Error naming the kernel if the launch failed.
#define AERIE_CUDA_LAUNCHED(name) AERIE_CUDA_CHECK(cudaGetLastError(), "launch of " name)

namespace aerie::cuda {

inline cudaStream_t stream() { return static_cast<cudaStream_t>(current_stream()); }
inline unsigned blocks_for(int64_t n, int threads) { return static_cast<unsigned>((n + threads - 1) / threads); }

/// Whether `bytes` of dynamic shared memory fit one block on the current GPU, or on the GPU that
/// AERIE_CUDA_EMULATE names (core/gpu_limits.h): kernels with several tile configurations pick by it.
inline bool smem_fits(size_t bytes) { return static_cast<int64_t>(bytes) <= gpu_limits().smem_per_block; }

/// Whether an SM of the current GPU (or of the emulated one) holds only one block of `bytes` of shared memory
/// (1 KiB of each block is the system's); false where the SM's size is unknown. Kernels with a shape for such SMs
/// (more warps or smaller tiles in the same memory) pick by it.
inline bool one_block_per_sm(size_t bytes) {
  const int64_t per_sm = gpu_limits().smem_per_sm;
  return per_sm > 0 && 2 * (static_cast<int64_t>(bytes) + 1024) > per_sm;
}

/// Before a launch with `bytes` of dynamic shared memory: throws aerie::Error naming `kernel` when they do not fit
/// (smem_fits), so that a configuration the GPU (or the emulated one) cannot hold fails loudly, never silently.
inline void check_smem(const char* kernel, size_t bytes) {
  if (smem_fits(bytes)) return;
  const GpuLimits l = gpu_limits();
  AERIE_THROW(kernel << ": needs " << bytes << " bytes of shared memory per block; "
                     << (l.emulated.empty() ? "this GPU" : l.emulated + " (" + kEmulateEnv + ")") << " allows "
                     << l.smem_per_block);
}

/// Whether plan_occupancy has set a carveout in this process (then it resets kernels to the default when the
/// emulation is off again, as tests turn it on and off).
inline std::atomic<bool> g_carveout_set{false};

/// Before a launch of `kernel`: under AERIE_CUDA_EMULATE, caps the shared memory of the SM it runs on at the
/// emulated GPU's (GpuLimits::carveout_percent, cudaFuncAttributePreferredSharedMemoryCarveout), so that the blocks
/// that share an SM are as many as on that GPU, not as on the larger SM of the H100 / H200 running it. The driver
/// takes the carveout as a hint (it picks the nearest configuration that can run the kernel). Without emulation
/// nothing is set, unless an earlier call set a carveout: then the kernel gets the driver's default back.
template <typename Kernel>
void plan_occupancy(Kernel kernel) {
  const int pct = gpu_limits().carveout_percent;
  if (pct < 0 && !g_carveout_set.load(std::memory_order_relaxed)) return;
  if (pct >= 0) g_carveout_set.store(true, std::memory_order_relaxed);
  AERIE_CUDA_CHECK(cudaFuncSetAttribute(reinterpret_cast<const void*>(kernel),
                                        cudaFuncAttributePreferredSharedMemoryCarveout, pct),
                   "cudaFuncSetAttribute(PreferredSharedMemoryCarveout, " << pct << ")");
}

__device__ __forceinline__ float to_f32(float x) { return x; }
__device__ __forceinline__ float to_f32(__nv_bfloat16 x) { return __bfloat162float(x); }
template <typename T> __device__ __forceinline__ T from_f32(float x);
template <> __device__ __forceinline__ float from_f32<float>(float x) { return x; }
template <> __device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
/// Sum over the block (blockDim.x a multiple of 32, at most 1024); every thread gets the result.
/// `scratch` is __shared__ float[32].
__device__ __forceinline__ float block_sum(float v, float* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  v = warp_sum(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < nwarps ? scratch[lane] : 0.0f;
  return warp_sum(v);
}
__device__ __forceinline__ float block_max(float v, float* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < nwarps ? scratch[lane] : -INFINITY;
  return warp_max(v);
}

}  // namespace aerie::cuda
