// RMSNorm (Zhang & Sennrich 2019; Hugging Face LlamaRMSNorm): y = x * rstd * w,
// rstd = 1 / sqrt(mean(x^2) + eps), computed in fp32.
//
// Dtypes (CPU and CUDA alike): activations and weights are F32 or BF16 in any combination; arithmetic
// is fp32 (bf16 inputs widened, outputs rounded to their tensor's dtype once, at the store). Note that
// Hugging Face rounds x * rstd to the input dtype before the weight multiply; aerie does not.
#pragma once
#include "core/tensor.h"

namespace aerie {

/// x: [N, H] F32|BF16, w: [H] F32|BF16 -> y: [N, H] F32|BF16 (its own dtype; may alias x when the
/// dtypes agree), rstd: [N] F32 (saved for backward; nullptr or an undefined Tensor when not needed).
/// Throws aerie::Error naming the tensor on a shape, dtype or device mismatch.
void rmsnorm_forward(const Tensor& x, const Tensor& w, float eps, Tensor& y, Tensor* rstd);
/// dy, x: [N, H] F32|BF16, w: [H] F32|BF16, rstd: [N] F32 from the forward -> dx: [N, H] F32|BF16
/// (overwritten; may alias dy or x when the dtypes agree), dw: [H] F32 (ADDED to, so gradients
/// accumulate over calls; pass nullptr for a frozen weight). On CUDA the rows' dw terms are summed in
/// fixed-size row chunks and then over chunks (deterministic), then added to dw.
void rmsnorm_backward(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& rstd, Tensor& dx,
                      Tensor* dw);

}  // namespace aerie
