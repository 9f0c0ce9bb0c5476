// CUDA weight dequantization (kernels/quant.h), the math of cpu/quant.cc element for element: one thread
// per output element (grid-stride), fp32 product, BF16 by the integer rounding of core/bf16.h (as
// cuda/convert.cu), so CPU and CUDA agree bit for bit.
#include <algorithm>

#include "core/fp8.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/quant.h"

namespace aerie::cuda {
namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ uint16_t f32_to_bf16_bits(float f) {
  uint32_t u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

template <typename Out> __device__ __forceinline__ void store(Out* out, int64_t i, float v);
template <> __device__ __forceinline__ void store<float>(float* out, int64_t i, float v) { out[i] = v; }
template <> __device__ __forceinline__ void store<uint16_t>(uint16_t* out, int64_t i, float v) {
  out[i] = f32_to_bf16_bits(v);
}

template <typename Out>
__global__ void dequant_fp8_block_kernel(const uint8_t* __restrict__ w, const float* __restrict__ scale_inv,
                                         int64_t n0, int64_t rows, int64_t k, Out* __restrict__ out) {
  const int64_t total = rows * k, scale_cols = (k + 127) / 128;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total; i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t n = n0 + i / k, j = i % k;
    store(out, i, fp8_e4m3fn_to_float(w[n * k + j]) * scale_inv[(n / 128) * scale_cols + j / 128]);
  }
}

template <typename Scale> __device__ __forceinline__ float load_scale(const Scale* s, int64_t i);
template <> __device__ __forceinline__ float load_scale<float>(const float* s, int64_t i) { return s[i]; }
template <> __device__ __forceinline__ float load_scale<uint16_t>(const uint16_t* s, int64_t i) {
  return __uint_as_float(static_cast<uint32_t>(s[i]) << 16);
}

template <typename Scale, typename Out>
__global__ void dequant_int4_packed_kernel(const int32_t* __restrict__ packed, const Scale* __restrict__ scale,
                                           int64_t k, int64_t group, int64_t n0, int64_t rows,
                                           Out* __restrict__ out) {
  const int64_t total = rows * k, words = (k + 7) / 8, groups = k / group;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total; i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t n = n0 + i / k, j = i % k;
    const uint32_t word = static_cast<uint32_t>(packed[n * words + j / 8]);
    const int q = static_cast<int>((word >> (4 * (j % 8))) & 0xFu) - 8;
    store(out, i, static_cast<float>(q) * load_scale(scale, n * groups + j / group));
  }
}

unsigned grid_for(int64_t total) { return std::min(blocks_for(total, kThreads), 65535u * 8u); }

}  // namespace

void dequant_fp8_block(const uint8_t* w, const float* scale_inv, int64_t n0, int64_t n1, int64_t k, void* out,
                       DType out_dtype) {
  const int64_t rows = n1 - n0;
  if (rows * k == 0) return;
  const unsigned blocks = grid_for(rows * k);
  if (out_dtype == DType::F32)
    dequant_fp8_block_kernel<<<blocks, kThreads, 0, stream()>>>(w, scale_inv, n0, rows, k, static_cast<float*>(out));
  else
    dequant_fp8_block_kernel<<<blocks, kThreads, 0, stream()>>>(w, scale_inv, n0, rows, k,
                                                                static_cast<uint16_t*>(out));
  AERIE_CUDA_LAUNCHED("dequant_fp8_block_kernel");
}

void dequant_int4_packed(const int32_t* packed, const void* scale, DType scale_dtype, int64_t k, int64_t group,
                         int64_t n0, int64_t n1, void* out, DType out_dtype) {
  const int64_t rows = n1 - n0;
  if (rows * k == 0) return;
  const unsigned blocks = grid_for(rows * k);
  const bool s32 = scale_dtype == DType::F32, o32 = out_dtype == DType::F32;
  const auto* sf = static_cast<const float*>(scale);
  const auto* sb = static_cast<const uint16_t*>(scale);
  auto* of = static_cast<float*>(out);
  auto* ob = static_cast<uint16_t*>(out);
  if (s32 && o32)
    dequant_int4_packed_kernel<<<blocks, kThreads, 0, stream()>>>(packed, sf, k, group, n0, rows, of);
  else if (s32)
    dequant_int4_packed_kernel<<<blocks, kThreads, 0, stream()>>>(packed, sf, k, group, n0, rows, ob);
  else if (o32)
    dequant_int4_packed_kernel<<<blocks, kThreads, 0, stream()>>>(packed, sb, k, group, n0, rows, of);
  else
    dequant_int4_packed_kernel<<<blocks, kThreads, 0, stream()>>>(packed, sb, k, group, n0, rows, ob);
  AERIE_CUDA_LAUNCHED("dequant_int4_packed_kernel");
}

}  // namespace aerie::cuda
