// SwiGLU (Shazeer 2020; Llama MLP): out = silu(gate) * up, silu(x) = x * sigmoid(x).
//
// Dtypes (CPU and CUDA alike): every tensor is F32 or BF16, in any combination; arithmetic is fp32
// (bf16 inputs widened, each output rounded to its own dtype once, at the store).
#pragma once
#include "core/tensor.h"

namespace aerie {

/// gate, up: [N, I] F32|BF16 -> out: [N, I] F32|BF16 (may alias gate or up when the dtypes agree).
void swiglu_forward(const Tensor& gate, const Tensor& up, Tensor& out);
/// dout, gate, up: [N, I] F32|BF16 -> dgate, dup: [N, I] F32|BF16 (overwritten; may alias dout, gate
/// or up when the dtypes agree, but not each other).
void swiglu_backward(const Tensor& dout, const Tensor& gate, const Tensor& up, Tensor& dgate, Tensor& dup);

}  // namespace aerie
