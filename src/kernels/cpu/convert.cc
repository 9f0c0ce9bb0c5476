// CPU dtype conversion (kernels/convert.h): bf16::from_float (round to nearest even) and static_cast.
#include <cstdint>

#include "core/bf16.h"
#include "core/tensor.h"

namespace aerie::cpu {

namespace {
template <typename S, typename D, typename F>
void convert_with(const void* src, void* dst, int64_t n, F f) {
  const S* s = static_cast<const S*>(src);
  D* d = static_cast<D*>(dst);
  for (int64_t i = 0; i < n; ++i) d[i] = f(s[i]);
}
}  // namespace

void convert(const void* src, DType src_dtype, void* dst, DType dst_dtype, int64_t n) {
  if (src_dtype == DType::F32 && dst_dtype == DType::BF16)
    convert_with<float, uint16_t>(src, dst, n, [](float x) { return bf16::from_float(x); });
  else if (src_dtype == DType::BF16 && dst_dtype == DType::F32)
    convert_with<uint16_t, float>(src, dst, n, [](uint16_t x) { return bf16::to_float(x); });
  else if (src_dtype == DType::I32 && dst_dtype == DType::I64)
    convert_with<int32_t, int64_t>(src, dst, n, [](int32_t x) { return static_cast<int64_t>(x); });
  else if (src_dtype == DType::I64 && dst_dtype == DType::I32)
    convert_with<int64_t, int32_t>(src, dst, n, [](int64_t x) { return static_cast<int32_t>(x); });
  else
    AERIE_THROW("cpu::convert: no conversion from " << dtype_name(src_dtype) << " to " << dtype_name(dst_dtype));
}

}  // namespace aerie::cpu
