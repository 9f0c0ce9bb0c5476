// What the CUDA benchmarks of tools/bench (bench_train.cc, bench_deepseek.cc, bench_attention.cc) share: a one-rank
// communicator, the device's memory figures, a synchronised timer, random GPU tensors and JSON string escaping.
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "core/device.h"
#include "core/error.h"
#include "core/tensor.h"
#include "kernels/convert.h"
#include "kernels/optim.h"

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

/// Random values on the GPU, fast: a pool of 4M U(-1, 1) values (splitmix64) uploaded once per dtype and
/// tiled into each tensor from a varying offset by device-to-device copies, then scaled.
class RandomFill {
 public:
  RandomFill() {
    std::vector<float> host(kPool);
    uint64_t x = 0x9e3779b97f4a7c15ull;
    for (float& v : host) {
      x += 0x9e3779b97f4a7c15ull;
      uint64_t z = x;
      z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
      z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
      z ^= z >> 31;
      v = static_cast<float>(static_cast<double>(z >> 11) * 0x1.0p-53 * 2.0 - 1.0);
    }
    f32_ = Tensor::from_vector(host, {kPool}).to_device(Device::CUDA);
    bf16_ = Tensor::empty({kPool}, DType::BF16, Device::CUDA);
    convert(f32_, bf16_);
  }
  /// t (F32 or BF16, on the GPU) = U(-scale, scale)-like values.
  void fill(Tensor& t, float scale) {
    const Tensor& pool = t.dtype() == DType::BF16 ? bf16_ : f32_;
    Tensor flat = t.reshape({t.numel()});
    int64_t src = (offset_ += 7919) % (kPool / 2);
    for (int64_t i = 0; i < t.numel();) {
      const int64_t n = std::min(t.numel() - i, kPool - src);
      flat.slice(i, i + n).copy_from(pool.slice(src, src + n));
      i += n;
      src = 0;
    }
    scale_inplace(t, scale);
  }

 private:
  static constexpr int64_t kPool = int64_t{1} << 22;
  Tensor f32_, bf16_;
  int64_t offset_ = 0;
};

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
