// CUDA fused forward ops, the math of cpu/fused.cc in fp32 (contract in kernels/fused.h):
//  - qkv_rope: x = a head vector of the packed q/k/v row; optional RMSNorm over the head (block sum of
//    squares), then y_i = x_i c - x_{i+d/2} s, y_{i+d/2} = x_{i+d/2} c + x_i s (q and k heads), v copied.
//    cosf/sinf are the accurate versions (no fast math), as cuda/rope.cu.
//  - swiglu_packed: out = (g sigmoid(g)) u with g, u the two halves of a packed row (accurate expf).
//  - add_rmsnorm: r += x, y = w (r rs), rs = 1 / sqrt(mean(r^2) + eps), as cuda/norm.cu.
#include <algorithm>

#include "kernels/cuda/float_io.cuh"
#include "kernels/cuda/fused.h"

namespace aerie::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kMaxHalf = 512;  // 2 KiB of kernel arguments, as cuda/rope.cu

struct InvFreq {
  float v[kMaxHalf];
};

// grid (n (nq + 2 nkv)), block (half rounded up to a multiple of 32): block = (row t, head h), thread i
// = the pair (i, i + half). Every branch before block_sum is uniform over the block.
__global__ void qkv_rope_kernel(CFloats qkv, const int32_t* positions, const __grid_constant__ InvFreq inv,
                                CFloats q_norm, CFloats k_norm, bool norm, float eps, int64_t nq, int64_t nkv,
                                int64_t half, Floats q, Floats k, Floats v) {
  __shared__ float scratch[32];
  const int64_t heads = nq + 2 * nkv, d = 2 * half;
  const int64_t t = blockIdx.x / heads, h = blockIdx.x % heads;
  const int64_t i = threadIdx.x;
  const bool active = i < half;
  const int64_t src = (t * heads + h) * d;
  float a = 0.0f, b = 0.0f;
  if (active) {
    a = qkv[src + i];
    b = qkv[src + i + half];
  }
  if (h >= nq + nkv) {  // a v head: copied
    if (active) {
      const int64_t dst = (t * nkv + (h - nq - nkv)) * d;
      v.set(dst + i, a);
      v.set(dst + i + half, b);
    }
    return;
  }
  const bool is_q = h < nq;
  if (norm) {
    const float ss = block_sum(a * a + b * b, scratch);
    const float rs = 1.0f / sqrtf(ss / static_cast<float>(d) + eps);
    const CFloats w = is_q ? q_norm : k_norm;
    if (active) {
      a = w[i] * (a * rs);
      b = w[i + half] * (b * rs);
    }
  }
  if (!active) return;
  const float ang = static_cast<float>(positions[t]) * inv.v[i];
  const float c = cosf(ang), s = sinf(ang);
  const Floats out = is_q ? q : k;
  const int64_t dst = is_q ? (t * nq + h) * d : (t * nkv + (h - nq)) * d;
  out.set(dst + i, a * c - b * s);
  out.set(dst + i + half, b * c + a * s);
}

__global__ void swiglu_packed_kernel(CFloats gu, int64_t inter, int64_t total, Floats out) {
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= total) return;
  const int64_t t = idx / inter, j = idx % inter;
  const float g = gu[t * 2 * inter + j], u = gu[t * 2 * inter + inter + j];
  out.set(idx, g * (1.0f / (1.0f + expf(-g))) * u);
}

// grid (n), block (kThreads): one row. Each thread reads back only the r elements it wrote itself.
__global__ void add_rmsnorm_kernel(float* r, CFloats x, CFloats w, float eps, int64_t h, Floats y) {
  __shared__ float scratch[32];
  const int64_t off = static_cast<int64_t>(blockIdx.x) * h;
  float ss = 0.0f;
  for (int64_t j = threadIdx.x; j < h; j += blockDim.x) {
    const float s = r[off + j] + x[off + j];
    r[off + j] = s;
    ss += s * s;
  }
  ss = block_sum(ss, scratch);
  const float rs = 1.0f / sqrtf(ss / static_cast<float>(h) + eps);
  for (int64_t j = threadIdx.x; j < h; j += blockDim.x) y.set(off + j, w[j] * (r[off + j] * rs));
}

}  // namespace

void qkv_rope_forward(const Tensor& qkv, const Tensor& positions, const std::vector<float>& inv_freq,
                      const Tensor& q_norm, const Tensor& k_norm, float eps, Tensor& q, Tensor& k, Tensor& v) {
  const int64_t n = q.dim(0), nq = q.dim(1), nkv = k.dim(1), half = q.dim(2) / 2;
  AERIE_CHECK(half <= kMaxHalf, "qkv_rope_forward: head_dim " << 2 * half << " exceeds the CUDA kernel's limit of "
                                                              << 2 * kMaxHalf);
  if (n == 0) return;
  InvFreq inv{};
  std::copy(inv_freq.begin(), inv_freq.end(), inv.v);
  const bool norm = q_norm.defined();
  const CFloats none{nullptr, false};
  const int threads = static_cast<int>((half + 31) / 32 * 32);
  qkv_rope_kernel<<<grid_x(n * (nq + 2 * nkv), "qkv_rope_forward"), threads, 0, stream()>>>(
      cfloats(qkv), positions.data<int32_t>(), inv, norm ? cfloats(q_norm) : none, norm ? cfloats(k_norm) : none,
      norm, eps, nq, nkv, half, floats(q), floats(k), floats(v));
  AERIE_CUDA_LAUNCHED("qkv_rope_kernel");
}

void swiglu_packed_forward(const Tensor& gu, Tensor& out) {
  const int64_t total = out.numel();
  if (total == 0) return;
  swiglu_packed_kernel<<<grid_x(blocks_for(total, kThreads), "swiglu_packed_forward"), kThreads, 0, stream()>>>(
      cfloats(gu), out.dim(1), total, floats(out));
  AERIE_CUDA_LAUNCHED("swiglu_packed_kernel");
}

void add_rmsnorm_forward(Tensor& r, const Tensor& x, const Tensor& w, float eps, Tensor& y) {
  const int64_t n = r.dim(0), h = r.dim(1);
  if (n == 0 || h == 0) return;
  add_rmsnorm_kernel<<<grid_x(n, "add_rmsnorm_forward"), kThreads, 0, stream()>>>(r.data<float>(), cfloats(x),
                                                                                   cfloats(w), eps, h, floats(y));
  AERIE_CUDA_LAUNCHED("add_rmsnorm_kernel");
}

}  // namespace aerie::cuda
