// The CUDA implementations of the loss family (src/kernels/cuda/loss.cu), called by the checked dispatch
// of src/kernels/loss.cc: arguments are already validated (shapes, dtypes, one CUDA device). Kernels run on
// the current stream (core/device.h). Plain C++ (no CUDA headers). Internal to src/kernels.
#pragma once
#include <cstdint>

#include "core/tensor.h"

namespace aerie::cuda {

/// logits (N, K) F32/BF16, target (N, K) F32, weight (N) F32, dlogits (N, K) F32/BF16 or nullptr (scaled by
/// grad_scale before its one rounding), argmax_host (N) on the host or nullptr (K > 0 then).
/// One block per row: an online max / sum-of-exp pass that also tracks the argmax (fp32 exp, double
/// partial sums), then dlogits. The weighted row losses are summed in a fixed order on the GPU; one copy
/// brings the sum and the argmaxes back; waits for the stream.
double soft_cross_entropy(const Tensor& logits, const Tensor& target, const Tensor& weight, Tensor* dlogits,
                          float grad_scale, int64_t* argmax_host);

/// y (N, K) = softmax of each row of x (N, K), both F32 or both BF16 (may alias); fp32 math.
void softmax_rows(const Tensor& x, Tensor& y);

/// out_host[N] = argmax of each row of x (N, K > 0) F32/BF16, ties: the smaller index. Waits for the stream.
void argmax_rows(const Tensor& x, int64_t* out_host);

/// The inverse of target_distribution's draft vocabulary: dindex (V) I32 gets dindex[selected[j]] = j and
/// -1 elsewhere. A selected (K) I64 id outside [0, V) sets bad_ids (1) I32 to 1, one not above the id
/// before it to 2 (selected must ascend). Queued on the current stream.
void draft_index(const Tensor& selected, Tensor& dindex, Tensor& bad_ids);

/// One row chunk of target_distribution: logits (n, V) F32, selected (K) I64 and its dindex (V) I32
/// (draft_index) -> probs (n, K) F32 (softmax of the selected columns), argmax (n) I64 (over all V, ties:
/// the smaller id). A selected id outside [0, V) gets probability NaN. One block per row, one pass over
/// its V logits.
void target_rows(const Tensor& logits, const Tensor& selected, const Tensor& dindex, Tensor& probs, Tensor& argmax);

}  // namespace aerie::cuda
