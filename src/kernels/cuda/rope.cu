// CUDA RoPE, the math of cpu/rope.cc in fp32: for i < d/2, c = cos(pos inv_freq[i]), s = sin(...)
// (s negated for the inverse), y_i = x_i c - x_{i+d/2} s, y_{i+d/2} = x_{i+d/2} c + x_i s.
// cosf/sinf are the accurate CUDA versions (no fast math): within 2 ulp of glibc's.
#include <algorithm>

#include "kernels/cuda/float_io.cuh"
#include "kernels/cuda/rope.h"

namespace aerie::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kMaxHalf = 512;  // 2 KiB of kernel arguments

struct InvFreq {
  float v[kMaxHalf];
};

// One thread per (row t, head, pair i): idx = ((t nh + head) half + i).
__global__ void rope_kernel(Floats x, const int32_t* positions, const __grid_constant__ InvFreq inv, int64_t nh,
                            int64_t half, int64_t total, bool inverse) {
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= total) return;
  const int64_t i = idx % half, row = idx / half;  // row = t nh + head
  const float ang = static_cast<float>(positions[row / nh]) * inv.v[i];
  const float c = cosf(ang), s = inverse ? -sinf(ang) : sinf(ang);
  const int64_t base = row * 2 * half;
  const float a = x[base + i], b = x[base + i + half];
  x.set(base + i, a * c - b * s);
  x.set(base + i + half, b * c + a * s);
}

// One block per token row t: the row's cos/sin, one per pair i, in shared memory first (every head of the
// row shares them: the same cosf/sinf of the same angle as rope_kernel), then every (head, i) pair of
// the row. Dynamic shared memory: 2 half floats.
__global__ void rope_row_kernel(Floats x, const int32_t* positions, const __grid_constant__ InvFreq inv, int64_t nh,
                                int64_t half, bool inverse) {
  extern __shared__ float cs[];  // [half] cos, then [half] sin (negated for the inverse)
  const int64_t t = blockIdx.x;
  const float pos = static_cast<float>(positions[t]);
  for (int64_t i = threadIdx.x; i < half; i += blockDim.x) {
    const float ang = pos * inv.v[i];
    cs[i] = cosf(ang);
    cs[half + i] = inverse ? -sinf(ang) : sinf(ang);
  }
  __syncthreads();
  const int64_t row0 = t * nh * 2 * half;
  for (int64_t idx = threadIdx.x; idx < nh * half; idx += blockDim.x) {
    const int64_t head = idx / half, i = idx - head * half;
    const int64_t base = row0 + head * 2 * half;
    const float c = cs[i], s = cs[half + i];
    const float a = x[base + i], b = x[base + i + half];
    x.set(base + i, a * c - b * s);
    x.set(base + i + half, b * c + a * s);
  }
}

// Interleaved: pair i of (row, head) is (2i, 2i+1), rotated and scaled.
__global__ void rope_interleaved_kernel(Floats x, const int32_t* positions, const __grid_constant__ InvFreq inv,
                                        int64_t nh, int64_t half, int64_t total, float scale) {
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= total) return;
  const int64_t i = idx % half, row = idx / half;  // row = t nh + head
  const float ang = static_cast<float>(positions[row / nh]) * inv.v[i];
  const float c = cosf(ang), s = sinf(ang);
  const int64_t base = row * 2 * half;
  const float a = x[base + 2 * i], b = x[base + 2 * i + 1];
  x.set(base + 2 * i, (a * c - b * s) * scale);
  x.set(base + 2 * i + 1, (b * c + a * s) * scale);
}

}  // namespace

void rope_apply_interleaved(Tensor& x, const Tensor& positions, const std::vector<float>& inv_freq, float scale) {
  const int64_t t = x.dim(0), nh = x.dim(1), half = x.dim(2) / 2;
  AERIE_CHECK(half <= kMaxHalf, "rope_apply_interleaved: d " << 2 * half << " exceeds the CUDA kernel's limit of "
                                                             << 2 * kMaxHalf);
  const int64_t total = t * nh * half;
  if (total == 0) return;
  InvFreq inv{};
  std::copy(inv_freq.begin(), inv_freq.end(), inv.v);
  rope_interleaved_kernel<<<grid_x(blocks_for(total, kThreads), "rope_apply_interleaved"), kThreads, 0, stream()>>>(
      floats(x), positions.data<int32_t>(), inv, nh, half, total, scale);
  AERIE_CUDA_LAUNCHED("rope_interleaved_kernel");
}

void rope_apply(Tensor& x, const Tensor& positions, const std::vector<float>& inv_freq, bool inverse) {
  const int64_t t = x.dim(0), nh = x.dim(1), half = x.dim(2) / 2;
  AERIE_CHECK(half <= kMaxHalf, "rope_apply: head_dim " << 2 * half << " exceeds the CUDA kernel's limit of "
                                                        << 2 * kMaxHalf);
  const int64_t total = t * nh * half;
  if (total == 0) return;
  InvFreq inv{};
  std::copy(inv_freq.begin(), inv_freq.end(), inv.v);
  if (nh > 1) {  // several heads share a row's angles: once per row
    rope_row_kernel<<<grid_x(t, "rope_apply"), kThreads, 2 * half * sizeof(float), stream()>>>(
        floats(x), positions.data<int32_t>(), inv, nh, half, inverse);
    AERIE_CUDA_LAUNCHED("rope_row_kernel");
    return;
  }
  rope_kernel<<<grid_x(blocks_for(total, kThreads), "rope_apply"), kThreads, 0, stream()>>>(
      floats(x), positions.data<int32_t>(), inv, nh, half, total, inverse);
  AERIE_CUDA_LAUNCHED("rope_kernel");
}

}  // namespace aerie::cuda
