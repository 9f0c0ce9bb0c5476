// CUDA RMSNorm, forward and backward (the math of cpu/norm.cc, op for op in fp32):
//   y_j = w_j (x_j r),  r = 1 / sqrt(sum_j x_j^2 / H + eps)
//   dx_i = r w_i dy_i - (r^3 / H) x_i sum_j dy_j w_j x_j,  dw_j += sum_rows dy_j x_j r.
// Aliasing (y = x, dx = dy or dx = x, same dtype) is safe: every thread reads element j of a row before
// it writes element j, and the row's reduction (a block barrier) ends all other reads of that row first.
#include <algorithm>

#include "kernels/cuda/float_io.cuh"
#include "kernels/cuda/norm.h"

namespace aerie::cuda {
namespace {

constexpr int kThreads = 256;       // per row block (a multiple of 32 for block_sum)
constexpr int64_t kMaxChunks = 1024;  // row chunks of the dw partial sums

// grid (N), block (kThreads): row blockIdx.x.
__global__ void rmsnorm_forward_kernel(CFloats x, CFloats w, float eps, int64_t h, Floats y, float* rstd) {
  __shared__ float scratch[32];
  const int64_t off = static_cast<int64_t>(blockIdx.x) * h;
  float ss = 0.0f;
  for (int64_t j = threadIdx.x; j < h; j += blockDim.x) {
    const float v = x[off + j];
    ss += v * v;
  }
  ss = block_sum(ss, scratch);
  const float rs = 1.0f / sqrtf(ss / static_cast<float>(h) + eps);
  for (int64_t j = threadIdx.x; j < h; j += blockDim.x) y.set(off + j, w[j] * (x[off + j] * rs));
  if (rstd && threadIdx.x == 0) rstd[blockIdx.x] = rs;
}

// grid (ceil(H / kThreads), chunks), block (kThreads): column j, rows [chunk * rows, (chunk + 1) * rows).
// partial (chunks, H) = sum over the chunk's rows of dy x r.
__global__ void rmsnorm_dw_partial_kernel(CFloats dy, CFloats x, const float* rstd, int64_t n, int64_t h,
                                          int64_t rows, float* partial) {
  const int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j >= h) return;
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * rows;
  const int64_t r1 = r0 + rows < n ? r0 + rows : n;
  float s = 0.0f;
  for (int64_t r = r0; r < r1; ++r) s += dy[r * h + j] * x[r * h + j] * rstd[r];
  partial[static_cast<int64_t>(blockIdx.y) * h + j] = s;
}

// grid (ceil(H / kThreads)), block (kThreads): dw_j += sum over chunks (in order) of partial[c, j].
__global__ void rmsnorm_dw_reduce_kernel(const float* partial, int64_t chunks, int64_t h, float* dw) {
  const int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j >= h) return;
  float s = 0.0f;
  for (int64_t c = 0; c < chunks; ++c) s += partial[c * h + j];
  dw[j] += s;
}

// grid (N), block (kThreads).
__global__ void rmsnorm_dx_kernel(CFloats dy, CFloats x, CFloats w, const float* rstd, int64_t h, Floats dx) {
  __shared__ float scratch[32];
  const int64_t off = static_cast<int64_t>(blockIdx.x) * h;
  const float rs = rstd[blockIdx.x];
  float dot = 0.0f;
  for (int64_t j = threadIdx.x; j < h; j += blockDim.x) dot += dy[off + j] * w[j] * x[off + j];
  dot = block_sum(dot, scratch);
  const float c = rs * rs * rs * dot / static_cast<float>(h);
  for (int64_t j = threadIdx.x; j < h; j += blockDim.x) {
    const float d = dy[off + j], xv = x[off + j];
    dx.set(off + j, rs * w[j] * d - c * xv);
  }
}

}  // namespace

void rmsnorm_forward(const Tensor& x, const Tensor& w, float eps, Tensor& y, Tensor* rstd) {
  const int64_t n = x.dim(0), h = x.dim(1);
  if (n == 0 || h == 0) return;
  rmsnorm_forward_kernel<<<grid_x(n, "rmsnorm_forward"), kThreads, 0, stream()>>>(
      cfloats(x), cfloats(w), eps, h, floats(y), rstd ? rstd->data<float>() : nullptr);
  AERIE_CUDA_LAUNCHED("rmsnorm_forward_kernel");
}

void rmsnorm_backward(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& rstd, Tensor& dx,
                      Tensor* dw) {
  const int64_t n = x.dim(0), h = x.dim(1);
  if (n == 0 || h == 0) return;
  if (dw) {  // before dx, which may alias dy or x
    const int64_t rows = std::max<int64_t>(32, (n + kMaxChunks - 1) / kMaxChunks);
    const int64_t chunks = (n + rows - 1) / rows;
    Tensor partial = Tensor::empty({chunks, h}, DType::F32, Device::CUDA);  // (chunks, H), stream-ordered
    const unsigned cols = grid_x(blocks_for(h, kThreads), "rmsnorm_backward");
    rmsnorm_dw_partial_kernel<<<dim3(cols, static_cast<unsigned>(chunks)), kThreads, 0, stream()>>>(
        cfloats(dy), cfloats(x), rstd.data<float>(), n, h, rows, partial.data<float>());
    AERIE_CUDA_LAUNCHED("rmsnorm_dw_partial_kernel");
    rmsnorm_dw_reduce_kernel<<<cols, kThreads, 0, stream()>>>(partial.data<float>(), chunks, h, dw->data<float>());
    AERIE_CUDA_LAUNCHED("rmsnorm_dw_reduce_kernel");
  }
  rmsnorm_dx_kernel<<<grid_x(n, "rmsnorm_backward"), kThreads, 0, stream()>>>(
      cfloats(dy), cfloats(x), cfloats(w), rstd.data<float>(), h, floats(dx));
  AERIE_CUDA_LAUNCHED("rmsnorm_dx_kernel");
}

}  // namespace aerie::cuda
