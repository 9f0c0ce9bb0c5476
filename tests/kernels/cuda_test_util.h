// Helpers of the CUDA-vs-CPU kernel tests (norm, rope, activation, embedding, optim): inputs of a given
// dtype on both devices, and the tolerances of a result of each dtype.
#pragma once
#include <string>
#include <vector>

#include "kernel_test_util.h"

namespace aerie::testing {

/// A seeded random tensor rounded to `dt` (F32 or BF16), on the CPU: the CPU reference and the GPU get
/// the very same (bf16-rounded) values.
inline Tensor random_as(const Shape& shape, DType dt, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  Tensor t = random_tensor(shape, seed, lo, hi);
  return dt == DType::F32 ? t : t.to(dt);
}

/// The GPU copy of a CPU tensor.
inline Tensor gpu(const Tensor& t) { return t.to_device(Device::CUDA); }

/// Tolerance of a GPU result against the CPU reference when both compute in fp32 and differ only in
/// the order of reductions and in the last ulp of expf/sinf/cosf (F32: a few ulp of O(1) values, rtol
/// 1e-5 is >= 10x the expected error of a 4096-term fp32 sum). BF16 results are rounded from those
/// fp32 values, so two of them can be one bf16 ulp apart (2^-7 relative at most) where the fp32 values
/// straddle a rounding boundary: rtol 1e-2.
struct Tol {
  float atol, rtol;
};
inline Tol tol_for(DType out) { return out == DType::F32 ? Tol{1e-5f, 1e-5f} : Tol{1e-5f, 1e-2f}; }

inline void expect_close_as(const Tensor& got, const Tensor& ref, DType out, const std::string& what) {
  const Tol t = tol_for(out);
  expect_close(got.to_float_vector(), ref.to_float_vector(), t.atol, t.rtol, what);
}

}  // namespace aerie::testing
