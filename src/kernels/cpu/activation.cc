// CPU SwiGLU: out = silu(gate) * up, silu(g) = g sigmoid(g); fp32.
#include <cmath>

#include "kernels/cpu/cpu_kernels.h"

namespace aerie::cpu {

namespace {
inline float sigmoid(float g) { return 1.0f / (1.0f + std::exp(-g)); }
}  // namespace

void swiglu_forward(const float* gate, const float* up, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = gate[i] * sigmoid(gate[i]) * up[i];
}

// d silu(g)/dg = s (1 + g (1 - s)), s = sigmoid(g).
void swiglu_backward(const float* dout, const float* gate, const float* up, float* dgate, float* dup, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float g = gate[i], s = sigmoid(g), d = dout[i];
    const float u = up[i];  // read before writing: dgate/dup may alias dout
    dup[i] = d * g * s;
    dgate[i] = d * u * s * (1.0f + g * (1.0f - s));
  }
}

}  // namespace aerie::cpu
