// The CUDA MoE router and expert sort of kernels/moe_router.h. Plain C++ (no CUDA headers). Internal to
// src/kernels.
#pragma once
#include <cstdint>

#include "core/tensor.h"
#include "kernels/moe_router.h"

namespace aerie::cuda {

/// Device pointers, arguments checked by kernels/moe_router.cc. One warp per token: the float operations
/// of cpu/moe_router.cc in the same order (expf aside). Queued on the current stream.
void moe_router_noaux_tc(const float* logits, const float* bias, int64_t t, int64_t e, const MoeRouterConfig& cfg,
                         int32_t* indices, float* weights);
/// The softmax top-k router (kernels/moe_router.h), one warp per token; lane 0 sums the exponentials and the
/// picked probabilities in the CPU's order. Queued on the current stream.
void moe_router_softmax_topk(const float* logits, int64_t t, int64_t e, const MoeRouterConfig& cfg, int32_t* indices,
                             float* weights);
/// Counts (one block per expert, no atomics), offsets (one thread), then the stable scatter (one block
/// per expert, block-wide prefix sums over chunks of pairs). Out-of-range indices are dropped; perm's
/// unused tail is -1. Queued on the current stream.
void moe_sort_by_expert(const int32_t* indices, int64_t pairs, int64_t e, int32_t* counts, int32_t* offsets,
                        int32_t* perm);

/// out[t, j] = sum_slot weights[t, slot] y[t k + slot, j] (contract in kernels/moe_router.h); one thread
/// per output element.
void moe_combine(const float* y, const float* weights, int64_t t, int64_t k, int64_t h, float* out);
/// kernels/moe_router.h moe_gather_pairs / moe_combine_rows on the current stream (checked there;
/// h, xs, ys: F32 or BF16 as `dt`). The same fp32 expression as moe_combine's kernel, so bitwise its
/// result on y = ys[row_of].
void moe_gather_pairs(const void* h, DType dt, const int32_t* perm, int64_t pairs, int64_t k, int64_t hd, void* xs,
                      int32_t* row_of);
void moe_combine_rows(const void* ys, DType dt, const int32_t* row_of, const float* weights, int64_t t, int64_t k,
                      int64_t hd, float* out);
/// kernels/moe_router.h moe_local_rows on the current stream (checked there): one thread per pair.
void moe_local_rows(int32_t* row_of, int64_t pairs, int64_t r0, int64_t r1);

}  // namespace aerie::cuda
