// SwiGLU: checks and device dispatch (see activation.h).
#include "kernels/activation.h"

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/dispatch.h"

namespace aerie {

using kernels::what;

void swiglu_forward(const Tensor& gate, const Tensor& up, Tensor& out) {
  constexpr const char* op = "swiglu_forward";
  AERIE_CHECK(gate.ndim() == 2, op << ": gate must be [N, I], got " << shape_str(gate.shape()));
  for (auto [name, t] : {std::pair<const char*, const Tensor*>{"gate", &gate}, {"up", &up}, {"out", &out}}) {
    t->check_shape(gate.shape(), what(op, name));
    t->check_dtype(DType::F32, what(op, name));
  }
  const Device dev = kernels::common_device(op, {{"gate", &gate}, {"up", &up}, {"out", &out}});
  if (dev != Device::CPU) kernels::throw_no_backend(op, dev);
  cpu::swiglu_forward(gate.data<float>(), up.data<float>(), out.data<float>(), gate.numel());
}

void swiglu_backward(const Tensor& dout, const Tensor& gate, const Tensor& up, Tensor& dgate, Tensor& dup) {
  constexpr const char* op = "swiglu_backward";
  AERIE_CHECK(gate.ndim() == 2, op << ": gate must be [N, I], got " << shape_str(gate.shape()));
  for (auto [name, t] : {std::pair<const char*, const Tensor*>{"dout", &dout}, {"gate", &gate}, {"up", &up},
                         {"dgate", &dgate}, {"dup", &dup}}) {
    t->check_shape(gate.shape(), what(op, name));
    t->check_dtype(DType::F32, what(op, name));
  }
  const Device dev = kernels::common_device(
      op, {{"dout", &dout}, {"gate", &gate}, {"up", &up}, {"dgate", &dgate}, {"dup", &dup}});
  if (dev != Device::CPU) kernels::throw_no_backend(op, dev);
  cpu::swiglu_backward(dout.data<float>(), gate.data<float>(), up.data<float>(), dgate.data<float>(),
                       dup.data<float>(), gate.numel());
}

}  // namespace aerie
