// Small layout ops on any device: copying a block of columns between two row-major matrices (the draft's TTT
// pass: the concat of [e, hn] and its split in the backward), and copying rows between tensors (the KV-cache
// appends and row gathers of a batched decoding step).
#pragma once
#include <vector>

#include "core/tensor.h"

namespace aerie {

/// dst[i, dst_col + j] = src[i, src_col + j] for every row i < N and column j < ncols.
/// src: [N, Cs], dst: [N, Cd], both 2-D with the same dtype (any dtype: the bytes are copied) and device;
/// needs 0 <= src_col, src_col + ncols <= Cs, 0 <= dst_col, dst_col + ncols <= Cd. The other columns of dst
/// are left unchanged. src and dst must not overlap. On CUDA: one cudaMemcpy2DAsync on the current stream
/// (returns at once). Throws aerie::Error naming the tensor on a shape/dtype/device mismatch or a column
/// range out of bounds.
void copy_columns(const Tensor& src, int64_t src_col, Tensor& dst, int64_t dst_col, int64_t ncols);

/// For each i: row dst_rows[i] of dst[i] = row src_rows[i] of src (the KV-cache append of a batched decoding
/// step: the new key rows of many sequences, each into its own cache, at once). src: [N, ...]; every dst[i]:
/// [R_i, ...] with src's dtype, device and elements per row (any dtype: bytes are copied); rows in range.
/// Two entries must not write the same row of the same tensor, and dst must not overlap src. CUDA: one kernel
/// launch per 64 rows on the current stream. Throws aerie::Error naming the entry on a size mismatch, a
/// dtype/device mismatch or a row out of range.
void scatter_rows(const Tensor& src, const std::vector<int64_t>& src_rows, const std::vector<Tensor*>& dst,
                  const std::vector<int64_t>& dst_rows);

}  // namespace aerie
