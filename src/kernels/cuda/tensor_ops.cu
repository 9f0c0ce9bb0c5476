// CUDA layout ops: a strided 2-D copy is cudaMemcpy2DAsync (no kernel of our own).
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/tensor_ops.h"

namespace aerie::cuda {

void copy_columns(const void* src, int64_t src_pitch, void* dst, int64_t dst_pitch, int64_t rows, int64_t width) {
  AERIE_CUDA_CHECK(cudaMemcpy2DAsync(dst, static_cast<size_t>(dst_pitch), src, static_cast<size_t>(src_pitch),
                                     static_cast<size_t>(width), static_cast<size_t>(rows), cudaMemcpyDeviceToDevice,
                                     stream()),
                   "copy_columns: cudaMemcpy2DAsync of " << rows << " rows of " << width << " bytes");
}

}  // namespace aerie::cuda
