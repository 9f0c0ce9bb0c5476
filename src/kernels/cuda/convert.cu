// CUDA dtype conversion (kernels/convert.h). F32 -> BF16 uses the integer rounding of core/bf16.h
// (not __float2bfloat16_rn, whose NaN is the canonical 0x7fff), so CPU and CUDA agree bit for bit.
#include <algorithm>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/convert.h"

namespace aerie::cuda {
namespace {

struct F32ToBf16 {
  __device__ uint16_t operator()(float f) const {
    uint32_t u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // NaN
    u += 0x7fffu + ((u >> 16) & 1u);
    return static_cast<uint16_t>(u >> 16);
  }
};
struct Bf16ToF32 {
  __device__ float operator()(uint16_t b) const { return __uint_as_float(static_cast<uint32_t>(b) << 16); }
};
template <typename S, typename D>
struct Cast {
  __device__ D operator()(S x) const { return static_cast<D>(x); }
};

template <typename S, typename D, typename F>
__global__ void convert_kernel(const S* __restrict__ src, D* __restrict__ dst, int64_t n, F f) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x)
    dst[i] = f(src[i]);
}

template <typename S, typename D, typename F>
void launch(const void* src, void* dst, int64_t n, F f) {
  constexpr int threads = 256;
  const unsigned blocks = std::min(blocks_for(n, threads), 65535u);  // grid-stride beyond
  convert_kernel<<<blocks, threads, 0, stream()>>>(static_cast<const S*>(src), static_cast<D*>(dst), n, f);
  AERIE_CUDA_LAUNCHED("convert_kernel");
}

}  // namespace

void convert(const void* src, DType src_dtype, void* dst, DType dst_dtype, int64_t n) {
  if (n == 0) return;
  if (src_dtype == DType::F32 && dst_dtype == DType::BF16)
    launch<float, uint16_t>(src, dst, n, F32ToBf16{});
  else if (src_dtype == DType::BF16 && dst_dtype == DType::F32)
    launch<uint16_t, float>(src, dst, n, Bf16ToF32{});
  else if (src_dtype == DType::I32 && dst_dtype == DType::I64)
    launch<int32_t, int64_t>(src, dst, n, Cast<int32_t, int64_t>{});
  else if (src_dtype == DType::I64 && dst_dtype == DType::I32)
    launch<int64_t, int32_t>(src, dst, n, Cast<int64_t, int32_t>{});
  else
    AERIE_THROW("cuda::convert: no conversion from " << dtype_name(src_dtype) << " to " << dtype_name(dst_dtype));
}

}  // namespace aerie::cuda
