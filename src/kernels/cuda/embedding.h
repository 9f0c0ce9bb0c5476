// CUDA embedding lookup and backward (contract in kernels/embedding.h), called by kernels/embedding.cc
// after its checks (ids already range-checked). Plain C++ (no CUDA headers).
#pragma once
#include "core/tensor.h"

namespace aerie::cuda {

/// One thread per output element: out[i, j] = table[ids[i] - row_offset, j] (converted to out's dtype).
void embedding_forward(const Tensor& ids, const Tensor& table, Tensor& out, int64_t row_offset);
/// One thread per dout element: atomicAdd(dtable[ids[i] - row_offset, j], dout[i, j]) in fp32.
void embedding_backward(const Tensor& ids, const Tensor& dout, Tensor& dtable, int64_t row_offset);

}  // namespace aerie::cuda
