// SwiGLU: checks and device dispatch (see activation.h). The CPU reference is fp32 only: BF16 tensors
// are widened here first and BF16 outputs rounded from an fp32 result.
#include "kernels/activation.h"

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cuda/activation.h"
#include "kernels/dispatch.h"

namespace aerie {

using kernels::what;
using kernels::check_float;
using kernels::as_f32;
using kernels::f32_out;
using kernels::store_f32;

void swiglu_forward(const Tensor& gate, const Tensor& up, Tensor& out) {
  constexpr const char* op = "swiglu_forward";
  AERIE_CHECK(gate.ndim() == 2, op << ": gate must be [N, I], got " << shape_str(gate.shape()));
  for (auto [name, t] : {std::pair<const char*, const Tensor*>{"gate", &gate}, {"up", &up}, {"out", &out}}) {
    t->check_shape(gate.shape(), what(op, name));
    check_float(*t, op, name);
  }
  const Device dev = kernels::common_device(op, {{"gate", &gate}, {"up", &up}, {"out", &out}});
  AERIE_CUDA_DISPATCH(op, dev, cuda::swiglu_forward(gate, up, out));
  const Tensor gf = as_f32(gate), uf = as_f32(up);
  Tensor of = f32_out(out);
  cpu::swiglu_forward(gf.data<float>(), uf.data<float>(), of.data<float>(), gate.numel());
  store_f32(out, of);
}

void swiglu_backward(const Tensor& dout, const Tensor& gate, const Tensor& up, Tensor& dgate, Tensor& dup) {
  constexpr const char* op = "swiglu_backward";
  AERIE_CHECK(gate.ndim() == 2, op << ": gate must be [N, I], got " << shape_str(gate.shape()));
  for (auto [name, t] : {std::pair<const char*, const Tensor*>{"dout", &dout}, {"gate", &gate}, {"up", &up},
                         {"dgate", &dgate}, {"dup", &dup}}) {
    t->check_shape(gate.shape(), what(op, name));
    check_float(*t, op, name);
  }
  const Device dev = kernels::common_device(
      op, {{"dout", &dout}, {"gate", &gate}, {"up", &up}, {"dgate", &dgate}, {"dup", &dup}});
  AERIE_CUDA_DISPATCH(op, dev, cuda::swiglu_backward(dout, gate, up, dgate, dup));
  const Tensor df = as_f32(dout), gf = as_f32(gate), uf = as_f32(up);
  Tensor dgf = f32_out(dgate), duf = f32_out(dup);
  cpu::swiglu_backward(df.data<float>(), gf.data<float>(), uf.data<float>(), dgf.data<float>(), duf.data<float>(),
                       gate.numel());
  store_f32(dgate, dgf);
  store_f32(dup, duf);
}

}  // namespace aerie
