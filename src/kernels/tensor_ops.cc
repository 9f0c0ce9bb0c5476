// Layout ops: checks and device dispatch (see tensor_ops.h).
#include "kernels/tensor_ops.h"

#include "kernels/dispatch.h"
#ifdef AERIE_WITH_CUDA
#include "kernels/cuda/tensor_ops.h"
#endif

namespace aerie {

namespace cpu {
// kernels/cpu/tensor_ops.cc: the reference (row by row memcpy).
void copy_columns(const void* src, int64_t src_pitch, void* dst, int64_t dst_pitch, int64_t rows, int64_t width);
}  // namespace cpu

void copy_columns(const Tensor& src, int64_t src_col, Tensor& dst, int64_t dst_col, int64_t ncols) {
  constexpr const char* op = "copy_columns";
  AERIE_CHECK(src.ndim() == 2 && dst.ndim() == 2, op << ": src " << shape_str(src.shape()) << " and dst "
                                                     << shape_str(dst.shape()) << " must be 2-D");
  AERIE_CHECK(src.dim(0) == dst.dim(0), op << ": src has " << src.dim(0) << " rows, dst " << dst.dim(0));
  AERIE_CHECK(src.dtype() == dst.dtype(), op << ": src is " << dtype_name(src.dtype()) << ", dst "
                                             << dtype_name(dst.dtype()));
  AERIE_CHECK(ncols >= 0 && src_col >= 0 && src_col + ncols <= src.dim(1),
              op << ": src columns [" << src_col << ", " << src_col + ncols << ") outside src "
                 << shape_str(src.shape()));
  AERIE_CHECK(dst_col >= 0 && dst_col + ncols <= dst.dim(1),
              op << ": dst columns [" << dst_col << ", " << dst_col + ncols << ") outside dst "
                 << shape_str(dst.shape()));
  const Device dev = kernels::common_device(op, {{"src", &src}, {"dst", &dst}});
  const int64_t es = static_cast<int64_t>(dtype_size(src.dtype()));
  const int64_t rows = src.dim(0);
  if (rows == 0 || ncols == 0) return;
  const char* s = static_cast<const char*>(src.raw()) + src_col * es;
  char* d = static_cast<char*>(dst.raw()) + dst_col * es;
  if (dev == Device::CUDA) {
#ifdef AERIE_WITH_CUDA
    cuda::copy_columns(s, src.dim(1) * es, d, dst.dim(1) * es, rows, ncols * es);
    return;
#else
    kernels::throw_no_backend(op, dev);
#endif
  }
  cpu::copy_columns(s, src.dim(1) * es, d, dst.dim(1) * es, rows, ncols * es);
}

}  // namespace aerie
