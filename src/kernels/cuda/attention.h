// The CUDA attention kernels (attention.cu), called by the checked dispatch of kernels/attention.cc with
// validated tensors, all on the current CUDA device (see kernels/attention.h for the contracts). Plain
// C++: compiles without the CUDA headers. Head dims up to 128 (throws aerie::Error above).
#pragma once
#include <cstdint>
#include <vector>

#include "core/tensor.h"

namespace aerie::cuda {

/// Flash-style forward: one block per (tile of query rows of one kv-head group, kv head[, key split]);
/// keys/values streamed through shared memory in tiles of 32 with an online softmax (BF16 with head dim
/// 64/128 and more than 64 packed rows: WMMA tensor cores, 64-key tiles); decoding-sized grids split the
/// keys over blocks and merge the partial results by log-sum-exp.
void attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, int64_t q_offset, float scale,
                       Tensor& out, Tensor* lse, int64_t window);
/// Packed samples (cu_seqlens [B+1] I32 on the device): block -> (sample, query tile).
void attention_forward_varlen(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& cu_seqlens,
                              float scale, Tensor& out, Tensor* lse);
/// Batched decoding (one row per sequence, each against its own cache): one block of four warps per
/// (sequence, head), one launch per 64 sequences; head dims up to 576 (MLA's latent).
void attention_decode_batch(const Tensor& q, const std::vector<int64_t>& rows, const std::vector<const Tensor*>& k,
                            const std::vector<const Tensor*>& v, const std::vector<int64_t>& lengths, float scale,
                            Tensor& out, int64_t window);
/// FlashAttention-2 backward: D = rowsum(dout * out), then dk/dv per key tile (loop over query tiles)
/// and dq per query tile (loop over key tiles), both recomputing P from lse; no atomics.
void attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                        const Tensor& lse, int64_t q_offset, float scale, Tensor& dq, Tensor& dk, Tensor& dv,
                        int64_t window);
/// TTT diagonal merge: one warp per (row, head); the diagonal in chunks of up to 8 keys.
void attention_merge_diagonal_forward(const Tensor& q, const std::vector<const Tensor*>& diag_k,
                                      const std::vector<const Tensor*>& diag_v, float scale, Tensor& out,
                                      Tensor& lse);
/// Its backward: one warp per (row, kv head) looping over the heads of the group (so that the diagonal
/// gradients of a row have one writer).
void attention_merge_diagonal_backward(const Tensor& dout, const Tensor& q, const std::vector<const Tensor*>& diag_k,
                                       const std::vector<const Tensor*>& diag_v, const Tensor& out,
                                       const Tensor& lse, float scale, Tensor& dq,
                                       const std::vector<Tensor*>& ddiag_k, const std::vector<Tensor*>& ddiag_v);

}  // namespace aerie::cuda
