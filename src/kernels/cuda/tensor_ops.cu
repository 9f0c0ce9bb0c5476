// CUDA layout ops: a strided 2-D copy is cudaMemcpy2DAsync; scatter_rows a kernel that copies one row per block.
#include <algorithm>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/tensor_ops.h"

namespace aerie::cuda {

void copy_columns(const void* src, int64_t src_pitch, void* dst, int64_t dst_pitch, int64_t rows, int64_t width) {
  AERIE_CUDA_CHECK(cudaMemcpy2DAsync(dst, static_cast<size_t>(dst_pitch), src, static_cast<size_t>(src_pitch),
                                     static_cast<size_t>(width), static_cast<size_t>(rows), cudaMemcpyDeviceToDevice,
                                     stream()),
                   "copy_columns: cudaMemcpy2DAsync of " << rows << " rows of " << width << " bytes");
}

}  // namespace aerie::cuda

namespace aerie::cuda {

namespace {

constexpr int kScatterMax = 64;  // rows per launch: the pointers travel as kernel parameters
struct ScatterRows {
  const void* from[kScatterMax];
  void* to[kScatterMax];
};

// One block per row; U: the copy unit (16, 4 or 1 bytes, by the rows' size and alignment).
template <typename U>
__global__ void scatter_rows_kernel(ScatterRows p, int64_t units) {
  const U* s = static_cast<const U*>(p.from[blockIdx.x]);
  U* d = static_cast<U*>(p.to[blockIdx.x]);
  for (int64_t i = threadIdx.x; i < units; i += blockDim.x) d[i] = s[i];
}

}  // namespace

void scatter_rows(const std::vector<const void*>& from, const std::vector<void*>& to, int64_t bytes) {
  auto aligned = [&](uintptr_t a) {
    for (size_t i = 0; i < from.size(); ++i)
      if (reinterpret_cast<uintptr_t>(from[i]) % a || reinterpret_cast<uintptr_t>(to[i]) % a) return false;
    return bytes % static_cast<int64_t>(a) == 0;
  };
  const int unit = aligned(16) ? 16 : aligned(4) ? 4 : 1;
  for (size_t b0 = 0; b0 < from.size(); b0 += kScatterMax) {
    const size_t nb = std::min<size_t>(kScatterMax, from.size() - b0);
    ScatterRows p{};
    for (size_t i = 0; i < nb; ++i) {
      p.from[i] = from[b0 + i];
      p.to[i] = to[b0 + i];
    }
    const int threads = 128;
    if (unit == 16)
      scatter_rows_kernel<uint4><<<static_cast<unsigned>(nb), threads, 0, stream()>>>(p, bytes / 16);
    else if (unit == 4)
      scatter_rows_kernel<uint32_t><<<static_cast<unsigned>(nb), threads, 0, stream()>>>(p, bytes / 4);
    else
      scatter_rows_kernel<unsigned char><<<static_cast<unsigned>(nb), threads, 0, stream()>>>(p, bytes);
    AERIE_CUDA_LAUNCHED("scatter_rows_kernel");
  }
}

}  // namespace aerie::cuda
