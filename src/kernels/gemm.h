// GEMM: c = alpha * op(a) @ op(b) + beta * c, row-major. Reference: BLAS sgemm semantics.
// CPU: cblas_sgemm (OpenBLAS) for F32; BF16 inputs are widened to fp32 (fp32 accumulation); a BF16 c is
// widened to fp32, computed, and rounded to nearest even once at the end.
// CUDA: cuBLASLt with CUBLAS_COMPUTE_32F (true fp32 arithmetic, no TF32) and fp32 alpha/beta, so results
// match the CPU up to fp32 summation order (and, for a BF16 c, the final bf16 rounding).
#pragma once
#include <vector>

#include "core/tensor.h"

namespace aerie {

/// a: [M, K] (or [K, M] when trans_a), b: [K, N] (or [N, K] when trans_b), c: [M, N]; all 2-D, same
/// device. a and b have one dtype, F32 or BF16; c is F32, or BF16 when a and b are BF16 (then the fp32
/// result alpha op(a) op(b) + beta c is rounded to bf16 once). K = 0 gives c = beta c.
/// A linear layer y = x W^T is matmul(x, W, y, false, true).
/// On CUDA the call is queued on the current stream (core/device.h) and returns at once.
/// Throws aerie::Error on mismatched shapes/dtypes/devices, and on CUDA on a cuBLASLt failure (with the
/// cuBLAS status string and the shapes).
void matmul(const Tensor& a, const Tensor& b, Tensor& c, bool trans_a, bool trans_b, float alpha = 1.0f,
            float beta = 0.0f);

}  // namespace aerie

namespace aerie {

/// Grouped GEMM (the routed experts of an MoE layer, rows sorted by expert): for every group g with
/// rows [offsets[g], offsets[g + 1]) of a and c,
///   c[rows] = a[rows] @ w[g]^T,      a [P, K], w[g] [N, K] (one N, K, dtype and device for all g), c [P, N].
/// offsets: G + 1 non-decreasing host values with offsets[G] <= P (rows outside every group are left
/// as they are); empty groups are skipped and their w[g] may be undefined. a, w, c share one dtype, F32
/// or BF16 (a BF16 c holds the fp32 result rounded once to bf16), and one device.
/// CPU: one GEMM per non-empty group (the reference). CUDA: one cublasGemmGroupedBatchedEx call over
/// the non-empty groups (fp32 compute, no TF32), queued on the current stream; its pointer arrays go
/// to the device with one small copy.
/// Throws aerie::Error on mismatched shapes, dtypes or devices (naming the group), on offsets that are
/// not non-decreasing or exceed P, and on CUDA on a cuBLAS failure (status and shapes).
void matmul_grouped(const Tensor& a, const std::vector<Tensor>& w, const std::vector<int64_t>& offsets, Tensor& c);

}  // namespace aerie
