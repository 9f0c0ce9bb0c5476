// AdamW and the gradient-norm helpers: checks and device dispatch (see optim.h).
#include "kernels/optim.h"

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/dispatch.h"

namespace aerie {

using kernels::what;

void adamw_step(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v, const AdamWParams& p, int64_t step) {
  constexpr const char* op = "adamw_step";
  AERIE_CHECK(step >= 1, op << ": step counts from 1, got " << step);
  for (auto [name, t] : {std::pair<const char*, const Tensor*>{"param", &param}, {"grad", &grad}, {"m", &m},
                         {"v", &v}}) {
    t->check_shape(param.shape(), what(op, name));
    t->check_dtype(DType::F32, what(op, name));
  }
  const Device dev = kernels::common_device(op, {{"param", &param}, {"grad", &grad}, {"m", &m}, {"v", &v}});
  if (dev != Device::CPU) kernels::throw_no_backend(op, dev);
  cpu::adamw_step(param.data<float>(), grad.data<float>(), m.data<float>(), v.data<float>(), param.numel(), p,
                  step);
}

double sum_squares(const Tensor& x) {
  x.check_dtype(DType::F32, "sum_squares: x");
  if (x.device() != Device::CPU) kernels::throw_no_backend("sum_squares", x.device());
  return cpu::sum_squares(x.data<float>(), x.numel());
}

void scale_inplace(Tensor& x, float s) {
  x.check_dtype(DType::F32, "scale_inplace: x");
  if (x.device() != Device::CPU) kernels::throw_no_backend("scale_inplace", x.device());
  cpu::scale_inplace(x.data<float>(), x.numel(), s);
}

void add_inplace(Tensor& y, const Tensor& x) {
  constexpr const char* op = "add_inplace";
  y.check_dtype(DType::F32, what(op, "y"));
  x.check_dtype(DType::F32, what(op, "x"));
  AERIE_CHECK(x.numel() == y.numel(), op << ": x " << shape_str(x.shape()) << " and y " << shape_str(y.shape())
                                         << " differ in numel");
  const Device dev = kernels::common_device(op, {{"y", &y}, {"x", &x}});
  if (dev != Device::CPU) kernels::throw_no_backend(op, dev);
  cpu::add_inplace(y.data<float>(), x.data<float>(), x.numel());
}

}  // namespace aerie
