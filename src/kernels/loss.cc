// Soft cross-entropy, softmax and argmax over rows: checks and device dispatch (see loss.h).
#include "kernels/loss.h"

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/dispatch.h"

namespace aerie {

using kernels::what;

double soft_cross_entropy(const Tensor& logits, const Tensor& target, const Tensor& weight, Tensor* dlogits) {
  constexpr const char* op = "soft_cross_entropy";
  AERIE_CHECK(logits.ndim() == 2, op << ": logits must be [N, K], got " << shape_str(logits.shape()));
  const int64_t n = logits.dim(0), k = logits.dim(1);
  logits.check_dtype(DType::F32, what(op, "logits"));
  target.check_shape({n, k}, what(op, "target"));
  target.check_dtype(DType::F32, what(op, "target"));
  weight.check_shape({n}, what(op, "weight"));
  weight.check_dtype(DType::F32, what(op, "weight"));
  if (dlogits) {
    dlogits->check_shape({n, k}, what(op, "dlogits"));
    dlogits->check_dtype(DType::F32, what(op, "dlogits"));
  }
  const Device dev =
      kernels::common_device(op, {{"logits", &logits}, {"target", &target}, {"weight", &weight}});
  if (dlogits) kernels::common_device(op, {{"logits", &logits}, {"dlogits", dlogits}});
  if (dev != Device::CPU) kernels::throw_no_backend(op, dev);
  return cpu::soft_cross_entropy(logits.data<float>(), target.data<float>(), weight.data<float>(), n, k,
                                 dlogits ? dlogits->data<float>() : nullptr);
}

void softmax_rows(const Tensor& x, Tensor& y) {
  constexpr const char* op = "softmax_rows";
  AERIE_CHECK(x.ndim() == 2, op << ": x must be [N, K], got " << shape_str(x.shape()));
  x.check_dtype(DType::F32, what(op, "x"));
  y.check_shape(x.shape(), what(op, "y"));
  y.check_dtype(DType::F32, what(op, "y"));
  const Device dev = kernels::common_device(op, {{"x", &x}, {"y", &y}});
  if (dev != Device::CPU) kernels::throw_no_backend(op, dev);
  cpu::softmax_rows(x.data<float>(), y.data<float>(), x.dim(0), x.dim(1));
}

std::vector<int64_t> argmax_rows(const Tensor& x) {
  constexpr const char* op = "argmax_rows";
  AERIE_CHECK(x.ndim() == 2 && x.dim(1) > 0, op << ": x must be [N, K] with K > 0, got " << shape_str(x.shape()));
  x.check_dtype(DType::F32, what(op, "x"));
  if (x.device() != Device::CPU) kernels::throw_no_backend(op, x.device());
  std::vector<int64_t> out(static_cast<size_t>(x.dim(0)));
  cpu::argmax_rows(x.data<float>(), x.dim(0), x.dim(1), out.data());
  return out;
}

}  // namespace aerie
