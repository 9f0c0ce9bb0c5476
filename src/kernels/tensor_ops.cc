// Layout ops: checks and device dispatch (see tensor_ops.h).
#include "kernels/tensor_ops.h"

#include <cstring>
#include <utility>

#include "kernels/cuda/tensor_ops.h"
#include "kernels/dispatch.h"

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
  AERIE_CUDA_DISPATCH(op, dev, cuda::copy_columns(s, src.dim(1) * es, d, dst.dim(1) * es, rows, ncols * es));
  cpu::copy_columns(s, src.dim(1) * es, d, dst.dim(1) * es, rows, ncols * es);
}

void scatter_rows(const Tensor& src, const std::vector<int64_t>& src_rows, const std::vector<Tensor*>& dst,
                  const std::vector<int64_t>& dst_rows) {
  constexpr const char* op = "scatter_rows";
  AERIE_CHECK(src_rows.size() == dst.size() && dst_rows.size() == dst.size(),
              op << ": " << src_rows.size() << " source rows, " << dst.size() << " destinations and " << dst_rows.size()
                 << " destination rows (one each per entry)");
  AERIE_CHECK(src.ndim() >= 1, op << ": src must have rows, got a scalar");
  const int64_t width = src.dim(0) > 0 ? src.numel() / src.dim(0) : 0;
  const int64_t es = static_cast<int64_t>(dtype_size(src.dtype()));
  std::vector<std::pair<const char*, const Tensor*>> devs{{"src", &src}};
  std::vector<const void*> from(dst.size());
  std::vector<void*> to(dst.size());
  for (size_t i = 0; i < dst.size(); ++i) {
    AERIE_CHECK(dst[i] && dst[i]->ndim() >= 1, op << ": entry " << i << " has no destination tensor with rows");
    const Tensor& t = *dst[i];
    AERIE_CHECK(t.dtype() == src.dtype(), op << ": entry " << i << "'s destination is " << dtype_name(t.dtype())
                                             << ", src " << dtype_name(src.dtype()));
    AERIE_CHECK(t.dim(0) > 0 && t.numel() / t.dim(0) == width,
                op << ": entry " << i << "'s destination " << shape_str(t.shape()) << " has rows of another size than src "
                   << shape_str(src.shape()));
    AERIE_CHECK(src_rows[i] >= 0 && src_rows[i] < src.dim(0),
                op << ": entry " << i << "'s source row " << src_rows[i] << " outside src's " << src.dim(0) << " rows");
    AERIE_CHECK(dst_rows[i] >= 0 && dst_rows[i] < t.dim(0), op << ": entry " << i << "'s destination row " << dst_rows[i]
                                                               << " outside its " << t.dim(0) << " rows");
    devs.push_back({"dst", dst[i]});
    from[i] = static_cast<const char*>(src.raw()) + src_rows[i] * width * es;
    to[i] = static_cast<char*>(dst[i]->raw()) + dst_rows[i] * width * es;
  }
  const Device dev = kernels::common_device(op, devs);
  if (dst.empty() || width == 0) return;
  AERIE_CUDA_DISPATCH(op, dev, cuda::scatter_rows(from, to, width * es));
  for (size_t i = 0; i < dst.size(); ++i) std::memcpy(to[i], from[i], static_cast<size_t>(width * es));
}

}  // namespace aerie
