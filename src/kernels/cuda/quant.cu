// CUDA weight dequantization (kernels/quant.h), the math of cpu/quant.cc element for element: one thread
// per output element (grid-stride), fp32 product, BF16 by the integer rounding of core/bf16.h (as
// cuda/convert.cu), so CPU and CUDA agree bit for bit.
#include <cuda_fp8.h>

#include <algorithm>

#include "core/fp8.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/quant.h"
#include "kernels/quant.h"

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

namespace {

/// 8 consecutive outputs (of one row) from their fp32 values: one 16-byte store for BF16, two for F32.
__device__ __forceinline__ void store8(void* out, bool f32, int64_t i, const float* v) {
  if (f32) {
    float4* o = reinterpret_cast<float4*>(static_cast<float*>(out) + i);
    o[0] = make_float4(v[0], v[1], v[2], v[3]);
    o[1] = make_float4(v[4], v[5], v[6], v[7]);
    return;
  }
  uint4 u;
  u.x = f32_to_bf16_bits(v[0]) | (static_cast<uint32_t>(f32_to_bf16_bits(v[1])) << 16);
  u.y = f32_to_bf16_bits(v[2]) | (static_cast<uint32_t>(f32_to_bf16_bits(v[3])) << 16);
  u.z = f32_to_bf16_bits(v[4]) | (static_cast<uint32_t>(f32_to_bf16_bits(v[5])) << 16);
  u.w = f32_to_bf16_bits(v[6]) | (static_cast<uint32_t>(f32_to_bf16_bits(v[7])) << 16);
  *reinterpret_cast<uint4*>(static_cast<uint16_t*>(out) + i) = u;
}

__global__ void dequant_batch_kernel(const DequantDesc* __restrict__ items) {
  const DequantDesc d = items[blockIdx.y];
  const int64_t total = d.rows * d.k;
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  if (d.vec) {
    // Eight outputs per thread (one INT4 word, or 8 FP8 bytes), one index division per eight: the same
    // products and roundings as the scalar path below.
    const int64_t per_row = d.k / 8;
    for (int64_t w = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; w < total / 8; w += stride) {
      const int64_t r = w / per_row, j = (w % per_row) * 8, n = d.n0 + r;
      float v[8];
      if (d.int4) {
        const uint32_t word = static_cast<uint32_t>(static_cast<const int32_t*>(d.weight)[n * per_row + j / 8]);
        const int64_t si = n * (d.k / d.group) + j / d.group;
        const float sc = d.scale_f32 ? load_scale(static_cast<const float*>(d.scale), si)
                                     : load_scale(static_cast<const uint16_t*>(d.scale), si);
#pragma unroll
        for (int t = 0; t < 8; ++t) v[t] = static_cast<float>(static_cast<int>((word >> (4 * t)) & 0xFu) - 8) * sc;
      } else {
        const uint2 b = *reinterpret_cast<const uint2*>(static_cast<const uint8_t*>(d.weight) + n * d.k + j);
        const float sc = static_cast<const float*>(d.scale)[(n / 128) * ((d.k + 127) / 128) + j / 128];
#pragma unroll
        for (int t = 0; t < 8; ++t)
          v[t] = fp8_e4m3fn_to_float(static_cast<uint8_t>(((t < 4 ? b.x : b.y) >> (8 * (t % 4))) & 0xFFu)) * sc;
      }
      store8(d.out, d.out_f32, r * d.k + j, v);
    }
    return;
  }
  if (!d.int4) {
    const auto* w = static_cast<const uint8_t*>(d.weight);
    const auto* s = static_cast<const float*>(d.scale);
    const int64_t scale_cols = (d.k + 127) / 128;
    for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total; i += stride) {
      const int64_t n = d.n0 + i / d.k, j = i % d.k;
      const float v = fp8_e4m3fn_to_float(w[n * d.k + j]) * s[(n / 128) * scale_cols + j / 128];
      if (d.out_f32) store(static_cast<float*>(d.out), i, v); else store(static_cast<uint16_t*>(d.out), i, v);
    }
    return;
  }
  const auto* packed = static_cast<const int32_t*>(d.weight);
  const int64_t words = (d.k + 7) / 8, groups = d.k / d.group;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total; i += stride) {
    const int64_t n = d.n0 + i / d.k, j = i % d.k;
    const uint32_t word = static_cast<uint32_t>(packed[n * words + j / 8]);
    const int q = static_cast<int>((word >> (4 * (j % 8))) & 0xFu) - 8;
    const int64_t si = n * groups + j / d.group;
    const float sc = d.scale_f32 ? load_scale(static_cast<const float*>(d.scale), si)
                                 : load_scale(static_cast<const uint16_t*>(d.scale), si);
    const float v = static_cast<float>(q) * sc;
    if (d.out_f32) store(static_cast<float*>(d.out), i, v); else store(static_cast<uint16_t*>(d.out), i, v);
  }
}

}  // namespace

void dequant_batch(const std::vector<DequantDesc>& items) {
  if (items.empty()) return;
  int64_t largest = 0;
  for (const DequantDesc& d : items) largest = std::max(largest, d.rows * d.k);
  if (largest == 0) return;
  AERIE_CHECK(items.size() <= 65535, "dequant_batch: " << items.size() << " items exceed the grid's 65535 rows");
  std::vector<DequantDesc> v = items;
  for (DequantDesc& d : v) {
    const auto aligned = [](const void* p, uintptr_t a) { return reinterpret_cast<uintptr_t>(p) % a == 0; };
    d.vec = d.k % 8 == 0 && (!d.int4 || d.group % 8 == 0) && aligned(d.out, 16) &&
            aligned(d.weight, d.int4 ? 4 : 8);
  }
  const size_t bytes = v.size() * sizeof(DequantDesc);
  const cudaStream_t s = stream();
  void* dev = alloc(bytes, current_stream());
  AERIE_CUDA_CHECK(cudaMemcpyAsync(dev, v.data(), bytes, cudaMemcpyHostToDevice, s),
                   "dequant_batch: cudaMemcpyAsync of " << items.size() << " descriptors");
  // Enough x blocks to fill the GPU for the largest item; smaller items finish early.
  const unsigned bx = std::min(blocks_for(largest / 8 + 1, kThreads), std::max(1u, 4096u / static_cast<unsigned>(items.size())) * 8u);
  dequant_batch_kernel<<<dim3(bx, static_cast<unsigned>(items.size())), kThreads, 0, s>>>(
      static_cast<const DequantDesc*>(dev));
  AERIE_CUDA_LAUNCHED("dequant_batch_kernel");
  free(dev, current_stream());
}

namespace {

// e4m3fn of x by the hardware conversion (cvt.rn.satfinite.e4m3x2.f32, sm_89+): round to nearest even,
// saturating at +-448, so for every non-NaN x the code of core/fp8.h float_to_fp8_e4m3fn (the CPU's);
// ~20x fewer instructions than that branchy software encoder, which made quantize_fp8_rows
// compute-bound (5 ms of a 42 ms 8B forward on an H200).
__device__ __forceinline__ uint8_t to_e4m3(float x) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  return static_cast<uint8_t>(__nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3));
#else
  return float_to_fp8_e4m3fn(x);
#endif
}

__device__ __forceinline__ float load_in(const void* x, bool f32, int64_t i) {
  return f32 ? static_cast<const float*>(x)[i]
             : __uint_as_float(static_cast<uint32_t>(static_cast<const uint16_t*>(x)[i]) << 16);
}

// One warp per (row, 128-column block): 4 columns per lane, the block's amax by shuffles, then the
// codes: the CPU reference's operations (fmax, IEEE division, float_to_fp8_e4m3fn), so the same bytes.
__global__ void quantize_fp8_rows_kernel(const void* __restrict__ x, bool f32, int64_t m, int64_t k,
                                         uint8_t* __restrict__ q, float* __restrict__ scale, bool aligned) {
  const int64_t blocks = (k + 127) / 128, warps = m * blocks;
  const int lane = threadIdx.x & 31;
  const int64_t stride = int64_t{gridDim.x} * (blockDim.x / 32);
  for (int64_t w = blockIdx.x * int64_t{blockDim.x / 32} + threadIdx.x / 32; w < warps; w += stride) {
    const int64_t r = w / blocks, b = w % blocks, k0 = b * 128;
    // vec: four consecutive columns per lane (one 8-byte BF16 / 16-byte F32 load, one 4-byte store of
    // codes) when the block is whole and rows start 4-aligned; else lane + 32 i. Same values either way.
    const bool vec = aligned && k % 4 == 0 && k0 + 128 <= k;
    float v[4];
    float amax = 0.0f;
    if (vec) {
      const int64_t j0 = r * k + k0 + 4 * lane;
      if (f32) {
        const float4 u = *reinterpret_cast<const float4*>(static_cast<const float*>(x) + j0);
        v[0] = u.x, v[1] = u.y, v[2] = u.z, v[3] = u.w;
      } else {
        const uint2 u = *reinterpret_cast<const uint2*>(static_cast<const uint16_t*>(x) + j0);
        v[0] = __uint_as_float(u.x << 16), v[1] = __uint_as_float(u.x & 0xffff0000u);
        v[2] = __uint_as_float(u.y << 16), v[3] = __uint_as_float(u.y & 0xffff0000u);
      }
#pragma unroll
      for (int i = 0; i < 4; ++i) amax = fmaxf(amax, fabsf(v[i]));
    } else {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int64_t j = k0 + lane + 32 * i;
        v[i] = j < k ? load_in(x, f32, r * k + j) : 0.0f;
        amax = fmaxf(amax, fabsf(v[i]));
      }
    }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, off));
    const float s = fmaxf(amax, kFp8MinAmax) / 448.0f;
    if (vec) {
      uint32_t codes = 0;
#pragma unroll
      for (int i = 0; i < 4; ++i) codes |= static_cast<uint32_t>(to_e4m3(v[i] / s)) << (8 * i);
      *reinterpret_cast<uint32_t*>(q + r * k + k0 + 4 * lane) = codes;
    } else {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int64_t j = k0 + lane + 32 * i;
        if (j < k) q[r * k + j] = to_e4m3(v[i] / s);
      }
    }
    if (lane == 0) scale[b * m + r] = s;
  }
}

// One thread block per 128 x 128 block of w: the amax by a shared-memory reduction, then the codes.
__global__ void quantize_fp8_block_kernel(const void* __restrict__ w, bool f32, int64_t n, int64_t k,
                                          uint8_t* __restrict__ q, float* __restrict__ scale_inv) {
  __shared__ float red[kThreads / 32];
  const int64_t cb = (k + 127) / 128, bi = blockIdx.x / cb, bj = blockIdx.x % cb;
  const int64_t r0 = bi * 128, c0 = bj * 128;
  const int64_t rows = min(int64_t{128}, n - r0), cols = min(int64_t{128}, k - c0);
  float amax = 0.0f;
  for (int64_t i = threadIdx.x; i < rows * cols; i += blockDim.x)
    amax = fmaxf(amax, fabsf(load_in(w, f32, (r0 + i / cols) * k + c0 + i % cols)));
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, off));
  if ((threadIdx.x & 31) == 0) red[threadIdx.x / 32] = amax;
  __syncthreads();
  amax = 0.0f;
  for (int i = 0; i < kThreads / 32; ++i) amax = fmaxf(amax, red[i]);
  const float s = fmaxf(amax, kFp8MinAmax) / 448.0f;
  for (int64_t i = threadIdx.x; i < rows * cols; i += blockDim.x) {
    const int64_t idx = (r0 + i / cols) * k + c0 + i % cols;
    q[idx] = to_e4m3(load_in(w, f32, idx) / s);
  }
  if (threadIdx.x == 0) scale_inv[bi * cb + bj] = s;
}

}  // namespace

void quantize_fp8_rows(const void* x, DType x_dtype, int64_t m, int64_t k, uint8_t* q, float* scale) {
  const int64_t warps = m * ((k + 127) / 128);
  if (warps == 0) return;
  const unsigned blocks = static_cast<unsigned>(std::min<int64_t>((warps + 7) / 8, 65535 * 8));
  const bool aligned = reinterpret_cast<uintptr_t>(x) % 16 == 0 && reinterpret_cast<uintptr_t>(q) % 4 == 0;
  quantize_fp8_rows_kernel<<<blocks, kThreads, 0, stream()>>>(x, x_dtype == DType::F32, m, k, q, scale, aligned);
  AERIE_CUDA_LAUNCHED("quantize_fp8_rows_kernel");
}

void quantize_fp8_block(const void* w, DType w_dtype, int64_t n, int64_t k, uint8_t* q, float* scale_inv) {
  const int64_t tiles = ((n + 127) / 128) * ((k + 127) / 128);
  if (tiles == 0) return;
  AERIE_CHECK(tiles <= 0x7fffffff, "quantize_fp8_block: " << tiles << " blocks of 128 x 128 are too many for one launch");
  quantize_fp8_block_kernel<<<static_cast<unsigned>(tiles), kThreads, 0, stream()>>>(w, w_dtype == DType::F32, n, k,
                                                                                     q, scale_inv);
  AERIE_CUDA_LAUNCHED("quantize_fp8_block_kernel");
}

}  // namespace aerie::cuda
