// Soft-target softmax cross-entropy (eagle3.md section 4): per row, CE = -sum_i q_i log softmax(z)_i,
// the forward KL to the target distribution q up to a constant.
#pragma once
#include <vector>

#include "core/tensor.h"

namespace aerie {

/// logits: [N, K] F32, target: [N, K] F32 (rows sum to 1), weight: [N] F32 (0 drops a row).
/// Returns sum_n weight_n * CE_n (double accumulation). When dlogits is non-null it receives
/// weight_n * (softmax(logits_n) - target_n) ([N, K], overwritten).
double soft_cross_entropy(const Tensor& logits, const Tensor& target, const Tensor& weight, Tensor* dlogits);

/// softmax over each row of x: [N, K] F32 -> y (may alias x).
void softmax_rows(const Tensor& x, Tensor& y);

/// argmax of each row of x: [N, K] F32 -> [N] (ties: the smaller index).
std::vector<int64_t> argmax_rows(const Tensor& x);

}  // namespace aerie
