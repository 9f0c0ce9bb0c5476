// The CUDA implementations of the loss family (src/kernels/cuda/loss.cu), called by the checked dispatch
// of src/kernels/loss.cc: arguments are already validated (shapes, dtypes, one CUDA device). Kernels run on
// the current stream (core/device.h). Plain C++ (no CUDA headers). Internal to src/kernels.
#pragma once
#include <cstdint>

#include "core/tensor.h"

namespace aerie::cuda {

/// logits (N, K) F32/BF16, target (N, K) F32, weight (N) F32, dlogits (N, K) logits' dtype or nullptr.
/// One block per row: an online max / sum-of-exp pass (fp32 exp, double partial sums), then dlogits.
/// The weighted row losses are summed in a fixed order on the GPU; waits for the stream (returns it).
double soft_cross_entropy(const Tensor& logits, const Tensor& target, const Tensor& weight, Tensor* dlogits);

/// y (N, K) = softmax of each row of x (N, K), both F32 or both BF16 (may alias); fp32 math.
void softmax_rows(const Tensor& x, Tensor& y);

/// out_host[N] = argmax of each row of x (N, K > 0) F32/BF16, ties: the smaller index. Waits for the stream.
void argmax_rows(const Tensor& x, int64_t* out_host);

/// One row chunk of target_distribution: logits (n, V) F32, selected (K) I64 -> probs (n, K) F32
/// (softmax of the selected columns), argmax (n) I64 (over all V, ties: the smaller id). A selected id
/// outside [0, V) sets bad_ids (1) I32 to 1 and its probability to NaN. One block per row.
void target_rows(const Tensor& logits, const Tensor& selected, Tensor& probs, Tensor& argmax, Tensor& bad_ids);

}  // namespace aerie::cuda
