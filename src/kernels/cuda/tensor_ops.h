// CUDA layout ops (contract in kernels/tensor_ops.h), called by kernels/tensor_ops.cc after its checks.
// Plain C++ (no CUDA headers).
#pragma once
#include <cstdint>
#include <vector>

namespace aerie::cuda {

/// `rows` rows of `width` bytes from src (row pitch src_pitch bytes) to dst (pitch dst_pitch), device to
/// device, queued on the current stream (cudaMemcpy2DAsync).
void copy_columns(const void* src, int64_t src_pitch, void* dst, int64_t dst_pitch, int64_t rows, int64_t width);

/// bytes bytes from each from[i] to to[i] (device pointers), all rows in one launch per 64 (scatter_rows).
void scatter_rows(const std::vector<const void*>& from, const std::vector<void*>& to, int64_t bytes);

}  // namespace aerie::cuda
