// SwiGLU: checks and device dispatch (see activation.h). The CPU reference is fp32 only: BF16 tensors
// are widened here first and BF16 outputs rounded from an fp32 result.
#include "kernels/activation.h"

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/dispatch.h"
#ifdef AERIE_WITH_CUDA
#include "kernels/cuda/activation.h"
#endif

namespace aerie {

using kernels::what;

namespace {

void check_float(const Tensor& t, const char* op, const char* name) {
  AERIE_CHECK(t.dtype() == DType::F32 || t.dtype() == DType::BF16,
              op << ": " << name << " must be F32 or BF16, got " << dtype_name(t.dtype()));
}
Tensor as_f32(const Tensor& t) { return t.dtype() == DType::F32 ? t : t.to(DType::F32); }
Tensor f32_out(const Tensor& out) { return out.dtype() == DType::F32 ? out : Tensor::empty(out.shape(), DType::F32); }
void store_f32(Tensor& out, const Tensor& f) {
  if (out.dtype() != DType::F32) out.copy_from(f.to(out.dtype()));
}

}  // namespace

void swiglu_forward(const Tensor& gate, const Tensor& up, Tensor& out) {
  constexpr const char* op = "swiglu_forward";
  AERIE_CHECK(gate.ndim() == 2, op << ": gate must be [N, I], got " << shape_str(gate.shape()));
  for (auto [name, t] : {std::pair<const char*, const Tensor*>{"gate", &gate}, {"up", &up}, {"out", &out}}) {
    t->check_shape(gate.shape(), what(op, name));
    check_float(*t, op, name);
  }
  const Device dev = kernels::common_device(op, {{"gate", &gate}, {"up", &up}, {"out", &out}});
  if (dev == Device::CUDA) {
#ifdef AERIE_WITH_CUDA
    cuda::swiglu_forward(gate, up, out);
    return;
#else
    kernels::throw_no_backend(op, dev);
#endif
  }
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
  if (dev == Device::CUDA) {
#ifdef AERIE_WITH_CUDA
    cuda::swiglu_backward(dout, gate, up, dgate, dup);
    return;
#else
    kernels::throw_no_backend(op, dev);
#endif
  }
  const Tensor df = as_f32(dout), gf = as_f32(gate), uf = as_f32(up);
  Tensor dgf = f32_out(dgate), duf = f32_out(dup);
  cpu::swiglu_backward(df.data<float>(), gf.data<float>(), uf.data<float>(), dgf.data<float>(), duf.data<float>(),
                       gate.numel());
  store_f32(dgate, dgf);
  store_f32(dup, duf);
}

}  // namespace aerie
