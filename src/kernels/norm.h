// RMSNorm (Zhang & Sennrich 2019; Hugging Face LlamaRMSNorm): y = x * rstd * w,
// rstd = 1 / sqrt(mean(x^2) + eps), computed in fp32.
#pragma once
#include "core/tensor.h"

namespace aerie {

/// x: [N, H] F32, w: [H] F32 -> y: [N, H] (may alias x), rstd: [N] F32 (saved for backward; may be
/// an undefined Tensor when not needed).
void rmsnorm_forward(const Tensor& x, const Tensor& w, float eps, Tensor& y, Tensor* rstd);
/// dy, x: [N, H], w: [H], rstd: [N] from the forward -> dx: [N, H] (overwritten; may alias dy or x),
/// dw: [H] (ADDED to, so gradients accumulate over calls; pass nullptr for a frozen weight).
void rmsnorm_backward(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& rstd, Tensor& dx,
                      Tensor* dw);

}  // namespace aerie
