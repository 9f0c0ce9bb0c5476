// CUDA side of kernels/mla.h (arguments checked there). Plain C++. Internal to src/kernels.
#pragma once
#include <cstdint>

#include "core/tensor.h"

namespace aerie::cuda {

/// Element pointers and leading dimensions as kernels/mla.h matmul_strided_batched describes; one
/// cublasGemmStridedBatchedEx call on the current stream.
void matmul_strided_batched(const void* a, int64_t lda, int64_t sa, const void* b, int64_t ldb, int64_t sb, void* c,
                            int64_t ldc, int64_t sc, DType ab, DType cd, int64_t m, int64_t n, int64_t k, int64_t batch,
                            bool trans_b);
/// causal_softmax_rows on device pointers: scores (R, L) F32 -> p (R, L) F32|BF16.
void causal_softmax_rows(const float* scores, int64_t rows, int64_t len, float scale, int64_t group,
                         int64_t first_pos, void* p, DType pd);

/// mla_expand_kv on device pointers (elements of `esize` bytes: 2 or 4).
void mla_expand_kv(const void* kv, const void* lat, int64_t L, int64_t nh, int64_t nope, int64_t vd, int64_t lora,
                   int64_t rope, int64_t dv, void* K, void* V, int esize);

}  // namespace aerie::cuda
