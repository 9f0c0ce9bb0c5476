// CUDA SwiGLU, the math of cpu/activation.cc in fp32: out = (g sigmoid(g)) u,
// dup = dout g s, dgate = dout u s (1 + g (1 - s)), s = sigmoid(g) = 1 / (1 + exp(-g)) (accurate expf).
// Each thread reads all inputs of its elements before writing them, so outputs may alias inputs. All-BF16
// tensors go 8 elements per thread (16-byte loads), others one element per thread.
#include "kernels/cuda/activation.h"

#include <algorithm>
#include <cstdint>
#include <initializer_list>

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

// The same math on 8 bf16 elements per thread (16-byte loads and stores), for all-BF16 tensors with
// n % 8 == 0 and 16-byte aligned pointers (the draft's [n, I] activations): the same fp32 operations and
// one round-to-nearest-even per output, so the values equal the scalar kernel's. Grid-stride over vectors.
struct Bf16x8 {
  float v[8];
};

__device__ __forceinline__ Bf16x8 load8(const void* p, int64_t i) {
  const uint4 r = reinterpret_cast<const uint4*>(p)[i];
  const auto* h = reinterpret_cast<const __nv_bfloat162*>(&r);
  Bf16x8 x;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const float2 f = __bfloat1622float2(h[j]);
    x.v[2 * j] = f.x;
    x.v[2 * j + 1] = f.y;
  }
  return x;
}

__device__ __forceinline__ void store8(void* p, int64_t i, const Bf16x8& x) {
  uint4 r;
  auto* h = reinterpret_cast<__nv_bfloat162*>(&r);
#pragma unroll
  for (int j = 0; j < 4; ++j) h[j] = __floats2bfloat162_rn(x.v[2 * j], x.v[2 * j + 1]);
  reinterpret_cast<uint4*>(p)[i] = r;
}

__global__ void swiglu_forward_bf16x8_kernel(const void* gate, const void* up, void* out, int64_t nv) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < nv;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const Bf16x8 g = load8(gate, i), u = load8(up, i);
    Bf16x8 o;
#pragma unroll
    for (int j = 0; j < 8; ++j) o.v[j] = g.v[j] * sigmoid(g.v[j]) * u.v[j];
    store8(out, i, o);
  }
}

__global__ void swiglu_backward_bf16x8_kernel(const void* dout, const void* gate, const void* up, void* dgate,
                                              void* dup, int64_t nv) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < nv;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const Bf16x8 g = load8(gate, i), d = load8(dout, i), u = load8(up, i);
    Bf16x8 dg, du;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const float s = sigmoid(g.v[j]);
      du.v[j] = d.v[j] * g.v[j] * s;
      dg.v[j] = d.v[j] * u.v[j] * s * (1.0f + g.v[j] * (1.0f - s));
    }
    store8(dup, i, du);
    store8(dgate, i, dg);
  }
}

/// Whether every tensor is BF16 with a 16-byte aligned start and the element count is a multiple of 8.
bool bf16x8(int64_t n, std::initializer_list<const Tensor*> ts) {
  if (n % 8 != 0) return false;
  for (const Tensor* t : ts)
    if (t->dtype() != DType::BF16 || reinterpret_cast<uintptr_t>(t->raw()) % 16 != 0) return false;
  return true;
}

/// Blocks for a grid-stride kernel over nv vectors: enough to fill the GPU several times over.
unsigned vector_blocks(int64_t nv) { return static_cast<unsigned>(std::min<int64_t>(blocks_for(nv, kThreads), 132 * 16)); }

}  // namespace

void swiglu_forward(const Tensor& gate, const Tensor& up, Tensor& out) {
  const int64_t n = gate.numel();
  if (n == 0) return;
  if (bf16x8(n, {&gate, &up, &out})) {
    swiglu_forward_bf16x8_kernel<<<vector_blocks(n / 8), kThreads, 0, stream()>>>(gate.raw(), up.raw(), out.raw(),
                                                                                n / 8);
    AERIE_CUDA_LAUNCHED("swiglu_forward_bf16x8_kernel");
    return;
  }
  swiglu_forward_kernel<<<grid_x(blocks_for(n, kThreads), "swiglu_forward"), kThreads, 0, stream()>>>(
      cfloats(gate), cfloats(up), floats(out), n);
  AERIE_CUDA_LAUNCHED("swiglu_forward_kernel");
}

void swiglu_backward(const Tensor& dout, const Tensor& gate, const Tensor& up, Tensor& dgate, Tensor& dup) {
  const int64_t n = gate.numel();
  if (n == 0) return;
  if (bf16x8(n, {&dout, &gate, &up, &dgate, &dup})) {
    swiglu_backward_bf16x8_kernel<<<vector_blocks(n / 8), kThreads, 0, stream()>>>(dout.raw(), gate.raw(), up.raw(),
                                                                                 dgate.raw(), dup.raw(), n / 8);
    AERIE_CUDA_LAUNCHED("swiglu_backward_bf16x8_kernel");
    return;
  }
  swiglu_backward_kernel<<<grid_x(blocks_for(n, kThreads), "swiglu_backward"), kThreads, 0, stream()>>>(
      cfloats(dout), cfloats(gate), cfloats(up), floats(dgate), floats(dup), n);
  AERIE_CUDA_LAUNCHED("swiglu_backward_kernel");
}

}  // namespace aerie::cuda
