// matmul: checks and device dispatch (see gemm.h).
#include "kernels/gemm.h"

#include <vector>

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/dispatch.h"
#ifdef AERIE_WITH_CUDA
#include "kernels/cuda/gemm.h"
#endif

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
  if (a.dtype() == DType::F32) c.check_dtype(DType::F32, kernels::what(op, "c (a, b are F32)"));
  AERIE_CHECK(c.dtype() == DType::F32 || c.dtype() == DType::BF16,
              op << ": c must be F32 or BF16, got " << dtype_name(c.dtype()));
  const Device dev = kernels::common_device(op, {{"a", &a}, {"b", &b}, {"c", &c}});
  if (dev == Device::CUDA) {
#ifdef AERIE_WITH_CUDA
    cuda::matmul(a, b, c, m, n, k, trans_a, trans_b, alpha, beta);
    return;
#else
    kernels::throw_no_backend(op, dev);
#endif
  }
  if (c.dtype() == DType::BF16) {  // fp32 result, rounded to bf16 once (bf16 a, b checked above)
    bf16* cb = c.data<bf16>();
    std::vector<float> cf(static_cast<size_t>(m * n));
    for (size_t i = 0; i < cf.size(); ++i) cf[i] = beta == 0.0f ? 0.0f : static_cast<float>(cb[i]);
    cpu::bgemm(a.data<bf16>(), b.data<bf16>(), cf.data(), m, n, k, trans_a, trans_b, alpha, beta);
    for (size_t i = 0; i < cf.size(); ++i) cb[i] = bf16(cf[i]);
    return;
  }
  if (a.dtype() == DType::F32)
    cpu::sgemm(a.data<float>(), b.data<float>(), c.data<float>(), m, n, k, trans_a, trans_b, alpha, beta);
  else
    cpu::bgemm(a.data<bf16>(), b.data<bf16>(), c.data<float>(), m, n, k, trans_a, trans_b, alpha, beta);
}

}  // namespace aerie
