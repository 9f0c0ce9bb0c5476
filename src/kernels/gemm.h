// GEMM: c = alpha * op(a) @ op(b) + beta * c, row-major. CPU: cblas_sgemm (OpenBLAS) for F32;
// BF16 inputs are widened to fp32 (fp32 accumulation). Reference: BLAS sgemm semantics.
#pragma once
#include "core/tensor.h"

namespace aerie {

/// a: [M, K] (or [K, M] when trans_a), b: [K, N] (or [N, K] when trans_b), c: [M, N]; all 2-D,
/// same dtype (F32 on CPU), same device. A linear layer y = x W^T is matmul(x, W, y, false, true).
/// Throws aerie::Error on mismatched shapes/dtypes/devices.
void matmul(const Tensor& a, const Tensor& b, Tensor& c, bool trans_a, bool trans_b, float alpha = 1.0f,
            float beta = 0.0f);

}  // namespace aerie
