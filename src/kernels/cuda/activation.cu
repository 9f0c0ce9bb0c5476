// CUDA SwiGLU, the math of cpu/activation.cc in fp32: out = (g sigmoid(g)) u,
// dup = dout g s, dgate = dout u s (1 + g (1 - s)), s = sigmoid(g) = 1 / (1 + exp(-g)) (accurate expf).
// Each thread reads all inputs of its element before writing it, so outputs may alias inputs.
#include "kernels/cuda/activation.h"
#include "kernels/cuda/float_io.cuh"

namespace aerie::cuda {
namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ float sigmoid(float g) { return 1.0f / (1.0f + expf(-g)); }

__global__ void swiglu_forward_kernel(CFloats gate, CFloats up, Floats out, int64_t n) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const float g = gate[i], u = up[i];
  out.set(i, g * sigmoid(g) * u);
}

__global__ void swiglu_backward_kernel(CFloats dout, CFloats gate, CFloats up, Floats dgate, Floats dup, int64_t n) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const float g = gate[i], s = sigmoid(g), d = dout[i], u = up[i];
  dup.set(i, d * g * s);
  dgate.set(i, d * u * s * (1.0f + g * (1.0f - s)));
}

}  // namespace

void swiglu_forward(const Tensor& gate, const Tensor& up, Tensor& out) {
  const int64_t n = gate.numel();
  if (n == 0) return;
  swiglu_forward_kernel<<<grid_x(blocks_for(n, kThreads), "swiglu_forward"), kThreads, 0, stream()>>>(
      cfloats(gate), cfloats(up), floats(out), n);
  AERIE_CUDA_LAUNCHED("swiglu_forward_kernel");
}

void swiglu_backward(const Tensor& dout, const Tensor& gate, const Tensor& up, Tensor& dgate, Tensor& dup) {
  const int64_t n = gate.numel();
  if (n == 0) return;
  swiglu_backward_kernel<<<grid_x(blocks_for(n, kThreads), "swiglu_backward"), kThreads, 0, stream()>>>(
      cfloats(dout), cfloats(gate), cfloats(up), floats(dgate), floats(dup), n);
  AERIE_CUDA_LAUNCHED("swiglu_backward_kernel");
}

}  // namespace aerie::cuda
