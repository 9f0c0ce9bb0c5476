// Small layout ops on 2-D tensors that the draft's TTT pass needs on any device: copying a block of
// columns between two row-major matrices (the concat of [e, hn] and its split in the backward).
#pragma once
#include "core/tensor.h"

namespace aerie {

/// dst[i, dst_col + j] = src[i, src_col + j] for every row i < N and column j < ncols.
/// src: [N, Cs], dst: [N, Cd], both 2-D with the same dtype (any dtype: the bytes are copied) and device;
/// needs 0 <= src_col, src_col + ncols <= Cs, 0 <= dst_col, dst_col + ncols <= Cd. The other columns of dst
/// are left unchanged. src and dst must not overlap. On CUDA: one cudaMemcpy2DAsync on the current stream
/// (returns at once). Throws aerie::Error naming the tensor on a shape/dtype/device mismatch or a column
/// range out of bounds.
void copy_columns(const Tensor& src, int64_t src_col, Tensor& dst, int64_t dst_col, int64_t ncols);

}  // namespace aerie
