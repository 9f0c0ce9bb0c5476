// What the CUDA benchmarks of tools/bench (bench_train.cc, bench_deepseek.cc) share: a one-rank
// communicator, the device's memory figures, a synchronised timer and JSON string escaping.
#pragma once
#include <cuda_runtime.h>

#include <chrono>
#include <string>

#include "comm/communicator.h"
#include "core/device.h"
#include "core/error.h"

namespace aerie::bench {

/// A communicator of one rank (no MPI needed): every collective is the identity.
using SoloComm = SelfCommunicator;

/// GiB of the stream-ordered pool's high-water mark (every aerie tensor comes from it); -1 if unknown.
inline double pool_high_gib() {
  cudaMemPool_t pool = nullptr;
  unsigned long long high = 0;  // NOLINT(runtime/int): the CUDA API's type
  if (cudaDeviceGetDefaultMemPool(&pool, cuda::current_device()) != cudaSuccess ||
      cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemHigh, &high) != cudaSuccess)
    return -1;
  return static_cast<double>(high) / (1024.0 * 1024.0 * 1024.0);
}

/// GiB in use on the device (cudaMemGetInfo: every process, the CUDA context included); -1 if unknown.
inline double device_used_gib() {
  size_t free_b = 0, total_b = 0;
  if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) return -1;
  return static_cast<double>(total_b - free_b) / (1024.0 * 1024.0 * 1024.0);
}

/// cudaDeviceSynchronize; throws aerie::Error with the CUDA error string.
inline void sync() {
  const cudaError_t e = cudaDeviceSynchronize();
  AERIE_CHECK(e == cudaSuccess, "bench: cudaDeviceSynchronize: " << cudaGetErrorString(e));
}

/// Mean seconds of `iters` calls of f after `warmup` calls (the device synchronised around the timed ones).
template <typename F>
double timed(int warmup, int iters, F&& f) {
  for (int i = 0; i < warmup; ++i) f();
  sync();
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < iters; ++i) f();
  sync();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / iters;
}

/// s with '"' and '\' escaped and newlines as \n, for a JSON string.
inline std::string json_escape(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '"' || c == '\\') o += '\\';
    if (c == '\n') {
      o += "\\n";
      continue;
    }
    o += c;
  }
  return o;
}

}  // namespace aerie::bench
