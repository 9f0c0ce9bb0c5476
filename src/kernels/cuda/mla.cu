// kernels/mla.h on CUDA. causal_softmax_rows: one block of 256 threads per row; max and sum by block
// reductions in fp32, as the CPU reference computes them (up to summation order).
#include <algorithm>

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

namespace {

template <typename T>
__global__ void mla_expand_kv_kernel(const T* __restrict__ kv, const T* __restrict__ lat, int64_t L, int64_t nh,
                                     int64_t nope, int64_t vd, int64_t lora, int64_t rope, int64_t dv, T* __restrict__ K,
                                     T* __restrict__ V) {
  const int64_t dk = nope + rope, w = dk + dv, total = L * nh * w;  // one (l, h) row of K then of V
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total; i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t lh = i / w, c = i % w, l = lh / nh;
    const T* src = kv + lh * (nope + vd);
    if (c < dk) {
      K[lh * dk + c] = c < nope ? src[c] : lat[l * (lora + rope) + lora + (c - nope)];
    } else {
      const int64_t j = c - dk;
      V[lh * dv + j] = j < vd ? src[nope + j] : T(0);
    }
  }
}

}  // namespace

void mla_expand_kv(const void* kv, const void* lat, int64_t L, int64_t nh, int64_t nope, int64_t vd, int64_t lora,
                   int64_t rope, int64_t dv, void* K, void* V, int esize) {
  const int64_t total = L * nh * (nope + rope + dv);
  const unsigned blocks = std::min(blocks_for(total, 256), 65535u * 8u);
  if (esize == 2)
    mla_expand_kv_kernel<<<blocks, 256, 0, stream()>>>(static_cast<const uint16_t*>(kv), static_cast<const uint16_t*>(lat),
                                                      L, nh, nope, vd, lora, rope, dv, static_cast<uint16_t*>(K),
                                                      static_cast<uint16_t*>(V));
  else
    mla_expand_kv_kernel<<<blocks, 256, 0, stream()>>>(static_cast<const float*>(kv), static_cast<const float*>(lat), L,
                                                      nh, nope, vd, lora, rope, dv, static_cast<float*>(K),
                                                      static_cast<float*>(V));
  AERIE_CUDA_LAUNCHED("mla_expand_kv_kernel");
}

}  // namespace aerie::cuda
