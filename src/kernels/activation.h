// SwiGLU (Shazeer 2020; Llama MLP): out = silu(gate) * up, silu(x) = x * sigmoid(x).
#pragma once
#include "core/tensor.h"

namespace aerie {

/// gate, up: [N, I] F32 -> out: [N, I].
void swiglu_forward(const Tensor& gate, const Tensor& up, Tensor& out);
/// dout, gate, up: [N, I] -> dgate, dup: [N, I] (overwritten).
void swiglu_backward(const Tensor& dout, const Tensor& gate, const Tensor& up, Tensor& dgate, Tensor& dup);

}  // namespace aerie
