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

namespace aerie {

void matmul_grouped(const Tensor& a, const std::vector<Tensor>& w, const std::vector<int64_t>& offsets, Tensor& c) {
  constexpr const char* op = "matmul_grouped";
  AERIE_CHECK(a.ndim() == 2 && c.ndim() == 2, op << ": a and c must be 2-D, got a " << shape_str(a.shape())
                                                 << ", c " << shape_str(c.shape()));
  const int64_t P = a.dim(0), K = a.dim(1), N = c.dim(1), G = static_cast<int64_t>(w.size());
  AERIE_CHECK(c.dim(0) == P, op << ": c " << shape_str(c.shape()) << " has not a's " << P << " rows");
  AERIE_CHECK(static_cast<int64_t>(offsets.size()) == G + 1,
              op << ": " << offsets.size() << " offsets for " << G << " groups (want G + 1)");
  AERIE_CHECK(a.dtype() == DType::F32 || a.dtype() == DType::BF16,
              op << ": a must be F32 or BF16, got " << dtype_name(a.dtype()));
  c.check_dtype(a.dtype(), kernels::what(op, "c"));
  const Device dev = kernels::common_device(op, {{"a", &a}, {"c", &c}});
  std::vector<int64_t> groups;  // the non-empty ones
  for (int64_t g = 0; g < G; ++g) {
    const int64_t r0 = offsets[g], r1 = offsets[g + 1];
    AERIE_CHECK(0 <= r0 && r0 <= r1 && r1 <= P,
                op << ": group " << g << " has rows [" << r0 << ", " << r1 << "), not within [0, " << P
                   << ") or not after the group before");
    if (r0 == r1) continue;
    const Tensor& wg = w[g];
    AERIE_CHECK(wg.defined() && wg.ndim() == 2 && wg.dim(0) == N && wg.dim(1) == K,
                op << ": group " << g << "'s weight is " << (wg.defined() ? shape_str(wg.shape()) : "undefined")
                   << ", want [" << N << ", " << K << "]");
    AERIE_CHECK(wg.dtype() == a.dtype(), op << ": group " << g << "'s weight is " << dtype_name(wg.dtype())
                                            << ", a is " << dtype_name(a.dtype()));
    AERIE_CHECK(wg.device() == dev, op << ": group " << g << "'s weight is on another device than a");
    groups.push_back(g);
  }
  if (groups.empty() || N == 0) return;
  if (dev == Device::CUDA) {
#ifdef AERIE_WITH_CUDA
    cuda::matmul_grouped(a, w, offsets, groups, c);
    return;
#else
    kernels::throw_no_backend(op, dev);
#endif
  }
  for (const int64_t g : groups) {
    const Tensor ag = a.slice(offsets[g], offsets[g + 1]);
    Tensor cg = c.slice(offsets[g], offsets[g + 1]);
    matmul(ag, w[g], cg, false, true);
  }
}

}  // namespace aerie
