// AdamW and the gradient-norm helpers: checks and device dispatch (see optim.h). The CPU reference of
// sum_squares, scale_inplace and add_inplace widens BF16 tensors to fp32 here first.
#include "kernels/optim.h"

#include <cmath>
#include <string>

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cuda/optim.h"
#include "kernels/dispatch.h"

namespace aerie {

using kernels::what;
using kernels::check_float;
using kernels::as_f32;

void adamw_step(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v, const AdamWParams& p, int64_t step) {
  constexpr const char* op = "adamw_step";
  AERIE_CHECK(step >= 1, op << ": step counts from 1, got " << step);
  for (auto [name, t] : {std::pair<const char*, const Tensor*>{"param", &param}, {"grad", &grad}, {"m", &m},
                         {"v", &v}}) {
    t->check_shape(param.shape(), what(op, name));
    t->check_dtype(DType::F32, what(op, name));
  }
  const Device dev = kernels::common_device(op, {{"param", &param}, {"grad", &grad}, {"m", &m}, {"v", &v}});
  AERIE_CUDA_DISPATCH(op, dev, cuda::adamw_step(param, grad, m, v, p, step));
  cpu::adamw_step(param.data<float>(), grad.data<float>(), m.data<float>(), v.data<float>(), param.numel(), p,
                  step);
}

double adamw_step_clipped(const std::vector<Tensor*>& params, const std::vector<const Tensor*>& grads,
                          const std::vector<Tensor*>& m, const std::vector<Tensor*>& v, const AdamWParams& p,
                          int64_t step, double max_grad_norm) {
  constexpr const char* op = "adamw_step_clipped";
  AERIE_CHECK(step >= 1, op << ": step counts from 1, got " << step);
  AERIE_CHECK(grads.size() == params.size() && m.size() == params.size() && v.size() == params.size(),
              op << ": " << params.size() << " params, " << grads.size() << " grads, " << m.size() << " m, "
                 << v.size() << " v");
  if (params.empty()) return 0.0;
  const Device dev = params[0] ? params[0]->device() : Device::CPU;
  for (size_t i = 0; i < params.size(); ++i) {
    std::string idx = "[";  // appended, not "[" + to_string(i): GCC 12 warns falsely (-Wrestrict) on that
    idx += std::to_string(i);
    idx += "]";
    AERIE_CHECK(params[i] && grads[i] && m[i] && v[i], op << ": null tensor at index " << i);
    for (auto [name, t] : {std::pair<const char*, const Tensor*>{"params", params[i]}, {"grads", grads[i]},
                           {"m", m[i]}, {"v", v[i]}}) {
      const std::string w = std::string(op) + ": " + name + idx;
      t->check_shape(params[i]->shape(), w);
      t->check_dtype(DType::F32, w);
      AERIE_CHECK(t->device() == dev, op << ": tensor " << name << idx << " is on " << device_name(t->device())
                                         << ", params[0] on " << device_name(dev));
    }
  }
  AERIE_CUDA_DISPATCH(op, dev, cuda::adamw_step_clipped(params, grads, m, v, p, step, max_grad_norm));
  // The composition of train/schedule.cc's clip_grad_norm and adamw_step, bit for bit (the scaled
  // gradient g * float(coef) is formed as it is read instead of stored).
  double ss = 0;
  for (const Tensor* g : grads) ss += cpu::sum_squares(g->data<float>(), g->numel());
  const double norm = std::sqrt(ss);
  float scale = 1.0f;
  if (max_grad_norm > 0) {
    const double coef = max_grad_norm / (norm + 1e-6);  // torch: clip_coef, clamped to 1
    if (coef < 1.0) scale = static_cast<float>(coef);
  }
  for (size_t i = 0; i < params.size(); ++i)
    cpu::adamw_step(params[i]->data<float>(), grads[i]->data<float>(), m[i]->data<float>(), v[i]->data<float>(),
                    params[i]->numel(), p, step, scale);
  return norm;
}

double sum_squares(const Tensor& x) {
  check_float(x, "sum_squares", "x");
  AERIE_CUDA_DISPATCH("sum_squares", x.device(), cuda::sum_squares(x));
  const Tensor xf = as_f32(x);
  return cpu::sum_squares(xf.data<float>(), x.numel());
}

void scale_inplace(Tensor& x, float s) {
  check_float(x, "scale_inplace", "x");
  AERIE_CUDA_DISPATCH("scale_inplace", x.device(), cuda::scale_inplace(x, s));
  if (x.dtype() == DType::F32) {
    cpu::scale_inplace(x.data<float>(), x.numel(), s);
    return;
  }
  Tensor xf = x.to(DType::F32);
  cpu::scale_inplace(xf.data<float>(), x.numel(), s);
  x.copy_from(xf.to(x.dtype()));
}

void add_inplace(Tensor& y, const Tensor& x) {
  constexpr const char* op = "add_inplace";
  check_float(y, op, "y");
  check_float(x, op, "x");
  AERIE_CHECK(x.numel() == y.numel(), op << ": x " << shape_str(x.shape()) << " and y " << shape_str(y.shape())
                                         << " differ in numel");
  const Device dev = kernels::common_device(op, {{"y", &y}, {"x", &x}});
  AERIE_CUDA_DISPATCH(op, dev, cuda::add_inplace(y, x));
  const Tensor xf = as_f32(x);
  if (y.dtype() == DType::F32) {
    cpu::add_inplace(y.data<float>(), xf.data<float>(), x.numel());
    return;
  }
  Tensor yf = y.to(DType::F32);
  cpu::add_inplace(yf.data<float>(), xf.data<float>(), x.numel());
  y.copy_from(yf.to(y.dtype()));
}

}  // namespace aerie
