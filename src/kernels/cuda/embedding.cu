// CUDA embedding: row gather (forward) and fp32 atomic scatter-add of rows (backward). The ids are
// range-checked on the host by kernels/embedding.cc before either kernel runs.
#include "kernels/cuda/embedding.h"
#include "kernels/cuda/float_io.cuh"

namespace aerie::cuda {
namespace {

constexpr int kThreads = 256;

// idx = i H + j over the (N, H) output.
__global__ void embedding_forward_kernel(const int32_t* ids, CFloats table, Floats out, int64_t h, int64_t total,
                                         int64_t row_offset) {
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= total) return;
  const int64_t i = idx / h, j = idx % h;
  const int64_t row = static_cast<int64_t>(ids[i]) - row_offset;
  out.set(idx, table[row * h + j]);
}

__global__ void embedding_backward_kernel(const int32_t* ids, CFloats dout, float* dtable, int64_t h, int64_t total,
                                          int64_t row_offset) {
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= total) return;
  const int64_t i = idx / h, j = idx % h;
  const int64_t row = static_cast<int64_t>(ids[i]) - row_offset;
  atomicAdd(dtable + row * h + j, dout[idx]);
}

}  // namespace

void embedding_forward(const Tensor& ids, const Tensor& table, Tensor& out, int64_t row_offset) {
  const int64_t total = out.numel(), h = table.dim(1);
  if (total == 0) return;
  embedding_forward_kernel<<<grid_x(blocks_for(total, kThreads), "embedding_forward"), kThreads, 0, stream()>>>(
      ids.data<int32_t>(), cfloats(table), floats(out), h, total, row_offset);
  AERIE_CUDA_LAUNCHED("embedding_forward_kernel");
}

void embedding_backward(const Tensor& ids, const Tensor& dout, Tensor& dtable, int64_t row_offset) {
  const int64_t total = dout.numel(), h = dtable.dim(1);
  if (total == 0) return;
  embedding_backward_kernel<<<grid_x(blocks_for(total, kThreads), "embedding_backward"), kThreads, 0, stream()>>>(
      ids.data<int32_t>(), cfloats(dout), dtable.data<float>(), h, total, row_offset);
  AERIE_CUDA_LAUNCHED("embedding_backward_kernel");
}

}  // namespace aerie::cuda
