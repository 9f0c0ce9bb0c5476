// CUDA AdamW and gradient-norm helpers. AdamW follows cpu/optim.cc op for op (torch's single-tensor
// path), with the same host-side scalars and round-to-nearest intrinsics (__fmul_rn, ...) so that no
// multiply-add is contracted into an FMA: given the same gradient, the update equals the CPU's.
//
// Multi-tensor layout: every tensor is cut into chunks of kChunk elements, one block per chunk; block b
// finds its tensor by binary search over the descriptors' first_block. Norm partials are per block
// (fp32), summed by one block in double in a fixed order: deterministic.
#include <cmath>
#include <cstring>

#include "kernels/cuda/float_io.cuh"
#include "kernels/cuda/optim.h"

namespace aerie::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kChunk = 16 * kThreads;  // elements per block
constexpr int kReduceThreads = 1024;

struct AdamTensor {
  float* p;
  const float* g;
  float* m;
  float* v;
  int64_t n;
  int64_t first_block;  // this tensor's chunks are blocks [first_block, first_block + ceil(n / kChunk))
};

// Host-side scalars of one step, computed as cpu/optim.cc computes them (double, cast at the op).
struct AdamScalars {
  float decay, w1, one_minus_w1, b2, w2, neg_step_size, bc2_sqrt, eps;
  bool decay_on;
};

AdamScalars adam_scalars(const AdamWParams& p, int64_t step) {
  const double lr = p.lr, b1 = p.beta1, b2 = p.beta2;
  AdamScalars s{};
  s.decay = static_cast<float>(1.0 - lr * p.weight_decay);
  s.w1 = static_cast<float>(1.0 - b1);
  s.one_minus_w1 = 1.0f - s.w1;
  s.b2 = static_cast<float>(b2);
  s.w2 = static_cast<float>(1.0 - b2);
  const double bc1 = 1.0 - std::pow(b1, static_cast<double>(step));
  const double bc2 = 1.0 - std::pow(b2, static_cast<double>(step));
  s.neg_step_size = static_cast<float>(-(lr / bc1));
  s.bc2_sqrt = static_cast<float>(std::sqrt(bc2));
  s.eps = p.eps;
  s.decay_on = p.weight_decay != 0.0f;
  return s;
}

/// The descriptor of block b: the last one whose first_block <= b (tensors without chunks share their
/// first_block with the next one, so they are never chosen).
__device__ __forceinline__ const AdamTensor& find_tensor(const AdamTensor* d, int nt, int64_t b) {
  int lo = 0, hi = nt - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (d[mid].first_block <= b)
      lo = mid;
    else
      hi = mid - 1;
  }
  return d[lo];
}

// One element of cpu::adamw_step, with g already scaled.
__device__ __forceinline__ void adamw_element(const AdamTensor& t, int64_t i, float g, const AdamScalars& s) {
  float p = t.p[i];
  if (s.decay_on) p = __fmul_rn(p, s.decay);
  float m = t.m[i];
  // torch lerp: weight < 0.5 ? self + w (end - self) : end - (end - self) (1 - w)
  m = s.w1 < 0.5f ? __fadd_rn(m, __fmul_rn(s.w1, __fsub_rn(g, m)))
                  : __fsub_rn(g, __fmul_rn(__fsub_rn(g, m), s.one_minus_w1));
  const float v = __fadd_rn(__fmul_rn(t.v[i], s.b2), __fmul_rn(__fmul_rn(s.w2, g), g));
  const float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(v), s.bc2_sqrt), s.eps);
  p = __fadd_rn(p, __fdiv_rn(__fmul_rn(s.neg_step_size, m), denom));
  t.p[i] = p;
  t.m[i] = m;
  t.v[i] = v;
}

// grid (total blocks), block (kThreads): partial[b] = sum of g^2 over block b's chunk (fp32).
__global__ void grad_sumsq_kernel(const AdamTensor* d, int nt, float* partial) {
  __shared__ float scratch[32];
  const int64_t b = blockIdx.x;
  const AdamTensor t = find_tensor(d, nt, b);  // a register copy: the stores below cannot alias it
  const int64_t begin = (b - t.first_block) * kChunk;
  const int64_t end = begin + kChunk < t.n ? begin + kChunk : t.n;
  float s = 0.0f;
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
    const float g = t.g[i];
    s += g * g;
  }
  s = block_sum(s, scratch);
  if (threadIdx.x == 0) partial[b] = s;
}

__device__ __forceinline__ double block_sum_double(double v, double* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < nwarps ? scratch[lane] : 0.0;
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// grid (1), block (kReduceThreads): out[0] = sum of the partials (double, fixed order). When coef is
// not null: out[0] becomes the norm sqrt(sum) and *coef the clip factor (1 when not clipping).
__global__ void reduce_partials_kernel(const float* partial, int64_t nb, double max_norm, double* out,
                                       float* coef) {
  __shared__ double scratch[32];
  double s = 0.0;
  for (int64_t i = threadIdx.x; i < nb; i += blockDim.x) s += static_cast<double>(partial[i]);
  s = block_sum_double(s, scratch);
  if (threadIdx.x != 0) return;
  if (!coef) {
    out[0] = s;
    return;
  }
  const double norm = sqrt(s);
  out[0] = norm;
  float c = 1.0f;
  if (max_norm > 0) {
    const double cd = max_norm / (norm + 1e-6);  // torch: clip_coef, clamped to 1
    if (cd < 1.0) c = static_cast<float>(cd);
  }
  *coef = c;
}

// grid (total blocks), block (kThreads): AdamW on block b's chunk, gradients times *coef (if given).
__global__ void adamw_multi_kernel(const AdamTensor* d, int nt, AdamScalars s, const float* coef) {
  const int64_t b = blockIdx.x;
  const AdamTensor t = find_tensor(d, nt, b);  // a register copy: the stores below cannot alias it
  const int64_t begin = (b - t.first_block) * kChunk;
  const int64_t end = begin + kChunk < t.n ? begin + kChunk : t.n;
  const float c = coef ? *coef : 1.0f;
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) adamw_element(t, i, __fmul_rn(t.g[i], c), s);
}

// grid (ceil(n / kThreads)): one tensor, unscaled gradients.
__global__ void adamw_single_kernel(AdamTensor t, AdamScalars s) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < t.n) adamw_element(t, i, t.g[i], s);
}

// grid (ceil(n / kChunk)), block (kThreads): partial[b] = sum of x^2 over chunk b (fp32).
__global__ void sumsq_kernel(CFloats x, int64_t n, float* partial) {
  __shared__ float scratch[32];
  const int64_t begin = static_cast<int64_t>(blockIdx.x) * kChunk;
  const int64_t end = begin + kChunk < n ? begin + kChunk : n;
  float s = 0.0f;
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
    const float v = x[i];
    s += v * v;
  }
  s = block_sum(s, scratch);
  if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

__global__ void scale_kernel(Floats x, int64_t n, float s) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) x.set(i, x[i] * s);
}

__global__ void add_kernel(Floats y, CFloats x, int64_t n) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) y.set(i, y[i] + x[i]);
}

/// Device scratch of `bytes` (stream-ordered, freed with the returned tensor on the current stream).
Tensor scratch_bytes(size_t bytes) {
  return Tensor::empty({static_cast<int64_t>(bytes)}, DType::U8, Device::CUDA);
}
size_t align8(size_t n) { return (n + 7) / 8 * 8; }

}  // namespace

void adamw_step(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v, const AdamWParams& p, int64_t step) {
  const int64_t n = param.numel();
  if (n == 0) return;
  AdamTensor t{param.data<float>(), grad.data<float>(), m.data<float>(), v.data<float>(), n, 0};
  adamw_single_kernel<<<grid_x(blocks_for(n, kThreads), "adamw_step"), kThreads, 0, stream()>>>(
      t, adam_scalars(p, step));
  AERIE_CUDA_LAUNCHED("adamw_single_kernel");
}

double adamw_step_clipped(const std::vector<Tensor*>& params, const std::vector<const Tensor*>& grads,
                          const std::vector<Tensor*>& m, const std::vector<Tensor*>& v, const AdamWParams& p,
                          int64_t step, double max_grad_norm) {
  const int nt = static_cast<int>(params.size());
  std::vector<AdamTensor> desc(params.size());
  int64_t blocks = 0;
  for (int i = 0; i < nt; ++i) {
    const int64_t n = params[i]->numel();
    desc[i] = {params[i]->data<float>(), grads[i]->data<float>(), m[i]->data<float>(), v[i]->data<float>(), n,
               blocks};
    blocks += (n + kChunk - 1) / kChunk;
  }
  if (blocks == 0) return 0.0;  // only empty tensors
  // One device buffer: descriptors | partials (blocks floats) | norm (double) | coef (float).
  const size_t desc_bytes = align8(desc.size() * sizeof(AdamTensor));
  const size_t part_bytes = align8(static_cast<size_t>(blocks) * sizeof(float));
  Tensor buf = scratch_bytes(desc_bytes + part_bytes + sizeof(double) + sizeof(float));
  uint8_t* base = buf.data<uint8_t>();
  auto* d_desc = reinterpret_cast<AdamTensor*>(base);
  auto* d_part = reinterpret_cast<float*>(base + desc_bytes);
  auto* d_norm = reinterpret_cast<double*>(base + desc_bytes + part_bytes);
  auto* d_coef = reinterpret_cast<float*>(base + desc_bytes + part_bytes + sizeof(double));
  cuda::memcpy(d_desc, desc.data(), desc.size() * sizeof(AdamTensor));
  const unsigned grid = grid_x(blocks, "adamw_step_clipped");
  grad_sumsq_kernel<<<grid, kThreads, 0, stream()>>>(d_desc, nt, d_part);
  AERIE_CUDA_LAUNCHED("grad_sumsq_kernel");
  reduce_partials_kernel<<<1, kReduceThreads, 0, stream()>>>(d_part, blocks, max_grad_norm, d_norm, d_coef);
  AERIE_CUDA_LAUNCHED("reduce_partials_kernel");
  adamw_multi_kernel<<<grid, kThreads, 0, stream()>>>(d_desc, nt, adam_scalars(p, step), d_coef);
  AERIE_CUDA_LAUNCHED("adamw_multi_kernel");
  double norm = 0.0;
  cuda::memcpy(&norm, d_norm, sizeof(double));  // waits for the stream
  return norm;
}

double sum_squares(const Tensor& x) {
  const int64_t n = x.numel();
  if (n == 0) return 0.0;
  const int64_t blocks = (n + kChunk - 1) / kChunk;
  const size_t part_bytes = align8(static_cast<size_t>(blocks) * sizeof(float));
  Tensor buf = scratch_bytes(part_bytes + sizeof(double));
  auto* d_part = reinterpret_cast<float*>(buf.data<uint8_t>());
  auto* d_sum = reinterpret_cast<double*>(buf.data<uint8_t>() + part_bytes);
  sumsq_kernel<<<grid_x(blocks, "sum_squares"), kThreads, 0, stream()>>>(cfloats(x), n, d_part);
  AERIE_CUDA_LAUNCHED("sumsq_kernel");
  reduce_partials_kernel<<<1, kReduceThreads, 0, stream()>>>(d_part, blocks, 0.0, d_sum, nullptr);
  AERIE_CUDA_LAUNCHED("reduce_partials_kernel");
  double s = 0.0;
  cuda::memcpy(&s, d_sum, sizeof(double));
  return s;
}

void scale_inplace(Tensor& x, float s) {
  const int64_t n = x.numel();
  if (n == 0) return;
  scale_kernel<<<grid_x(blocks_for(n, kThreads), "scale_inplace"), kThreads, 0, stream()>>>(floats(x), n, s);
  AERIE_CUDA_LAUNCHED("scale_kernel");
}

void add_inplace(Tensor& y, const Tensor& x) {
  const int64_t n = y.numel();
  if (n == 0) return;
  add_kernel<<<grid_x(blocks_for(n, kThreads), "add_inplace"), kThreads, 0, stream()>>>(floats(y), cfloats(x), n);
  AERIE_CUDA_LAUNCHED("add_kernel");
}

}  // namespace aerie::cuda
