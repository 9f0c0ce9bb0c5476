// RMSNorm: checks and device dispatch (see norm.h). The CPU reference is fp32 only: BF16 tensors are
// widened here first and BF16 outputs rounded from an fp32 result.
#include "kernels/norm.h"

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cuda/norm.h"
#include "kernels/dispatch.h"

namespace aerie {

using kernels::what;
using kernels::check_float;
using kernels::as_f32;
using kernels::f32_out;
using kernels::store_f32;

void rmsnorm_forward(const Tensor& x, const Tensor& w, float eps, Tensor& y, Tensor* rstd) {
  constexpr const char* op = "rmsnorm_forward";
  AERIE_CHECK(x.ndim() == 2, op << ": x must be [N, H], got " << shape_str(x.shape()));
  const int64_t n = x.dim(0), h = x.dim(1);
  check_float(x, op, "x");
  w.check_shape({h}, what(op, "w"));
  check_float(w, op, "w");
  y.check_shape({n, h}, what(op, "y"));
  check_float(y, op, "y");
  const bool want_rstd = rstd && rstd->defined();
  if (want_rstd) {
    rstd->check_shape({n}, what(op, "rstd"));
    rstd->check_dtype(DType::F32, what(op, "rstd"));
  }
  const Device dev = kernels::common_device(op, {{"x", &x}, {"w", &w}, {"y", &y}});
  if (want_rstd) kernels::common_device(op, {{"x", &x}, {"rstd", rstd}});
  AERIE_CUDA_DISPATCH(op, dev, cuda::rmsnorm_forward(x, w, eps, y, want_rstd ? rstd : nullptr));
  const Tensor xf = as_f32(x), wf = as_f32(w);
  Tensor yf = f32_out(y);
  cpu::rmsnorm_forward(xf.data<float>(), wf.data<float>(), eps, n, h, yf.data<float>(),
                       want_rstd ? rstd->data<float>() : nullptr);
  store_f32(y, yf);
}

void rmsnorm_backward(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& rstd, Tensor& dx,
                      Tensor* dw) {
  constexpr const char* op = "rmsnorm_backward";
  AERIE_CHECK(x.ndim() == 2, op << ": x must be [N, H], got " << shape_str(x.shape()));
  const int64_t n = x.dim(0), h = x.dim(1);
  for (auto [name, t] : {std::pair<const char*, const Tensor*>{"dy", &dy}, {"x", &x}, {"dx", &dx}}) {
    t->check_shape({n, h}, what(op, name));
    check_float(*t, op, name);
  }
  w.check_shape({h}, what(op, "w"));
  check_float(w, op, "w");
  rstd.check_shape({n}, what(op, "rstd"));
  rstd.check_dtype(DType::F32, what(op, "rstd"));
  if (dw) {
    dw->check_shape({h}, what(op, "dw"));
    dw->check_dtype(DType::F32, what(op, "dw"));
  }
  const Device dev =
      kernels::common_device(op, {{"dy", &dy}, {"x", &x}, {"w", &w}, {"rstd", &rstd}, {"dx", &dx}});
  if (dw) kernels::common_device(op, {{"x", &x}, {"dw", dw}});
  AERIE_CUDA_DISPATCH(op, dev, cuda::rmsnorm_backward(dy, x, w, rstd, dx, dw));
  const Tensor dyf = as_f32(dy), xf = as_f32(x), wf = as_f32(w);
  Tensor dxf = f32_out(dx);
  cpu::rmsnorm_backward(dyf.data<float>(), xf.data<float>(), wf.data<float>(), rstd.data<float>(), n, h,
                        dxf.data<float>(), dw ? dw->data<float>() : nullptr);
  store_f32(dx, dxf);
}

}  // namespace aerie
