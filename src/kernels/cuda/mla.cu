// causal_softmax_rows on CUDA (kernels/mla.h): one block of 256 threads per row; max and sum by block
// reductions in fp32, as the CPU reference computes them (up to summation order).
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/mla.h"

namespace aerie::cuda {
namespace {

template <typename T>
__global__ void causal_softmax_rows_kernel(const float* __restrict__ s, int64_t len, float scale, int64_t group,
                                           int64_t first_pos, T* __restrict__ p) {
  __shared__ float scratch[32];
  const int64_t r = blockIdx.x, keys = first_pos + r / group + 1;
  const float* row = s + r * len;
  float m = -INFINITY;
  for (int64_t j = threadIdx.x; j < keys; j += blockDim.x) m = fmaxf(m, scale * row[j]);
  m = block_max(m, scratch);
  float sum = 0.0f;
  for (int64_t j = threadIdx.x; j < keys; j += blockDim.x) sum += __expf(scale * row[j] - m);
  sum = block_sum(sum, scratch);
  const float inv = 1.0f / sum;
  for (int64_t j = threadIdx.x; j < len; j += blockDim.x)
    p[r * len + j] = from_f32<T>(j < keys ? __expf(scale * row[j] - m) * inv : 0.0f);
}

}  // namespace

void causal_softmax_rows(const float* scores, int64_t rows, int64_t len, float scale, int64_t group,
                         int64_t first_pos, void* p, DType pd) {
  AERIE_CHECK(rows <= 2147483647, "causal_softmax_rows: " << rows << " rows exceed the grid");
  const auto blocks = static_cast<unsigned>(rows);
  if (pd == DType::F32)
    causal_softmax_rows_kernel<<<blocks, 256, 0, stream()>>>(scores, len, scale, group, first_pos,
                                                              static_cast<float*>(p));
  else
    causal_softmax_rows_kernel<<<blocks, 256, 0, stream()>>>(scores, len, scale, group, first_pos,
                                                              static_cast<__nv_bfloat16*>(p));
  AERIE_CUDA_LAUNCHED("causal_softmax_rows_kernel");
}

}  // namespace aerie::cuda
