// RMSNorm: checks and device dispatch (see norm.h).
#include "kernels/norm.h"

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/dispatch.h"

namespace aerie {

using kernels::what;

void rmsnorm_forward(const Tensor& x, const Tensor& w, float eps, Tensor& y, Tensor* rstd) {
  constexpr const char* op = "rmsnorm_forward";
  AERIE_CHECK(x.ndim() == 2, op << ": x must be [N, H], got " << shape_str(x.shape()));
  const int64_t n = x.dim(0), h = x.dim(1);
  x.check_dtype(DType::F32, what(op, "x"));
  w.check_shape({h}, what(op, "w"));
  w.check_dtype(DType::F32, what(op, "w"));
  y.check_shape({n, h}, what(op, "y"));
  y.check_dtype(DType::F32, what(op, "y"));
  const bool want_rstd = rstd && rstd->defined();
  if (want_rstd) {
    rstd->check_shape({n}, what(op, "rstd"));
    rstd->check_dtype(DType::F32, what(op, "rstd"));
  }
  const Device dev = kernels::common_device(op, {{"x", &x}, {"w", &w}, {"y", &y}});
  if (want_rstd) kernels::common_device(op, {{"x", &x}, {"rstd", rstd}});
  if (dev != Device::CPU) kernels::throw_no_backend(op, dev);
  cpu::rmsnorm_forward(x.data<float>(), w.data<float>(), eps, n, h, y.data<float>(),
                       want_rstd ? rstd->data<float>() : nullptr);
}

void rmsnorm_backward(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& rstd, Tensor& dx,
                      Tensor* dw) {
  constexpr const char* op = "rmsnorm_backward";
  AERIE_CHECK(x.ndim() == 2, op << ": x must be [N, H], got " << shape_str(x.shape()));
  const int64_t n = x.dim(0), h = x.dim(1);
  for (auto [name, t] : {std::pair<const char*, const Tensor*>{"dy", &dy}, {"x", &x}, {"dx", &dx}}) {
    t->check_shape({n, h}, what(op, name));
    t->check_dtype(DType::F32, what(op, name));
  }
  w.check_shape({h}, what(op, "w"));
  w.check_dtype(DType::F32, what(op, "w"));
  rstd.check_shape({n}, what(op, "rstd"));
  rstd.check_dtype(DType::F32, what(op, "rstd"));
  if (dw) {
    dw->check_shape({h}, what(op, "dw"));
    dw->check_dtype(DType::F32, what(op, "dw"));
  }
  const Device dev =
      kernels::common_device(op, {{"dy", &dy}, {"x", &x}, {"w", &w}, {"rstd", &rstd}, {"dx", &dx}});
  if (dw) kernels::common_device(op, {{"x", &x}, {"dw", dw}});
  if (dev != Device::CPU) kernels::throw_no_backend(op, dev);
  cpu::rmsnorm_backward(dy.data<float>(), x.data<float>(), w.data<float>(), rstd.data<float>(), n, h,
                        dx.data<float>(), dw ? dw->data<float>() : nullptr);
}

}  // namespace aerie
