// convert: checks and device dispatch (see convert.h).
#include "kernels/convert.h"

#include "kernels/cuda/convert.h"
#include "kernels/dispatch.h"

namespace aerie {
namespace cpu {
// cpu/convert.cc: dst (n) = src (n) converted; the pair is already checked.
void convert(const void* src, DType src_dtype, void* dst, DType dst_dtype, int64_t n);
}  // namespace cpu

void convert(const Tensor& src, Tensor& dst) {
  constexpr const char* op = "convert";
  dst.check_shape(src.shape(), kernels::what(op, "dst"));
  const DType s = src.dtype(), d = dst.dtype();
  const bool ok = s == d || (s == DType::F32 && d == DType::BF16) || (s == DType::BF16 && d == DType::F32) ||
                  (s == DType::I32 && d == DType::I64) || (s == DType::I64 && d == DType::I32);
  AERIE_CHECK(ok, op << ": no conversion from " << dtype_name(s) << " (src) to " << dtype_name(d)
                     << " (dst); supported: F32<->BF16, I32<->I64, and any dtype to itself");
  const Device dev = kernels::common_device(op, {{"src", &src}, {"dst", &dst}});
  if (src.numel() == 0) return;
  if (s == d) {
    dst.copy_from(src);
    return;
  }
  AERIE_CUDA_DISPATCH(op, dev, cuda::convert(src.raw(), s, dst.raw(), d, src.numel()));
  cpu::convert(src.raw(), s, dst.raw(), d, src.numel());
}

}  // namespace aerie
