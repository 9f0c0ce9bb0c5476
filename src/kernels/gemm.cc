// matmul: checks and device dispatch (see gemm.h).
#include "kernels/gemm.h"

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/dispatch.h"

namespace aerie {

void matmul(const Tensor& a, const Tensor& b, Tensor& c, bool trans_a, bool trans_b, float alpha, float beta) {
  constexpr const char* op = "matmul";
  AERIE_CHECK(a.ndim() == 2 && b.ndim() == 2 && c.ndim() == 2,
              op << ": a, b, c must be 2-D, got a " << shape_str(a.shape()) << ", b " << shape_str(b.shape())
                 << ", c " << shape_str(c.shape()));
  const int64_t m = trans_a ? a.dim(1) : a.dim(0), k = trans_a ? a.dim(0) : a.dim(1);
  const int64_t kb = trans_b ? b.dim(1) : b.dim(0), n = trans_b ? b.dim(0) : b.dim(1);
  AERIE_CHECK(k == kb, op << ": inner dimensions differ: a " << shape_str(a.shape()) << (trans_a ? "^T" : "")
                          << " vs b " << shape_str(b.shape()) << (trans_b ? "^T" : ""));
  c.check_shape({m, n}, kernels::what(op, "c"));
  AERIE_CHECK(a.dtype() == b.dtype(), op << ": a is " << dtype_name(a.dtype()) << ", b is "
                                         << dtype_name(b.dtype()));
  AERIE_CHECK(a.dtype() == DType::F32 || a.dtype() == DType::BF16,
              op << ": a, b must be F32 or BF16, got " << dtype_name(a.dtype()));
  c.check_dtype(DType::F32, kernels::what(op, "c"));
  const Device dev = kernels::common_device(op, {{"a", &a}, {"b", &b}, {"c", &c}});
  if (dev != Device::CPU) kernels::throw_no_backend(op, dev);
  if (a.dtype() == DType::F32)
    cpu::sgemm(a.data<float>(), b.data<float>(), c.data<float>(), m, n, k, trans_a, trans_b, alpha, beta);
  else
    cpu::bgemm(a.data<bf16>(), b.data<bf16>(), c.data<float>(), m, n, k, trans_a, trans_b, alpha, beta);
}

}  // namespace aerie
