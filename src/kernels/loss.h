// Soft-target softmax cross-entropy (eagle3.md section 4): per row, CE = -sum_i q_i log softmax(z)_i,
// the forward KL to the target distribution q up to a constant; softmax and argmax over rows; and the
// TTT target distribution q = softmax(l restricted to the draft vocabulary) with the full-vocabulary
// argmax of l = W_lm z (eagle3.md sections 1 and 4). CPU and CUDA (same semantics; CUDA notes below).
#pragma once
#include <vector>

#include "core/tensor.h"

namespace aerie {

/// logits: [N, K] F32 or BF16, target: [N, K] F32 (rows sum to 1), weight: [N] F32 (0 drops a row).
/// Returns sum_n weight_n * CE_n (double accumulation). When dlogits is non-null it receives
/// grad_scale * weight_n * (softmax(logits_n) - target_n) ([N, K], F32 or BF16 whatever logits' dtype:
/// computed in fp32 and rounded once to dlogits' dtype; overwritten; a row of weight 0 gets 0; may be
/// `&logits` itself, in place, when the two share a dtype). When argmax is non-null it receives each
/// row's argmax of logits (ties: the smaller index; every row, weight 0 too; K > 0). The TTT step takes
/// all of it from one call: its loss, acc_k's argmax and the lm_head's gradient in the GEMM's dtype,
/// scaled by the step weight (what soft_cross_entropy, argmax_rows, scale_inplace and convert gave in
/// four passes over [N, K], with the same values). All on one device. CPU: per-row double sums, that
/// composition of steps. CUDA: one block per row, fp32 exponentials with double partial sums, rows
/// reduced in a fixed order (deterministic); the call returns after the work on the current stream is
/// done (it returns the loss and the argmaxes to the host).
/// Throws aerie::Error on shape/dtype/device mismatch, or an argmax asked of rows with K = 0.
double soft_cross_entropy(const Tensor& logits, const Tensor& target, const Tensor& weight, Tensor* dlogits,
                          float grad_scale = 1.0f, std::vector<int64_t>* argmax = nullptr);

/// softmax over each row of x: [N, K] F32 or BF16 -> y (same shape and dtype, may alias x); fp32 math.
void softmax_rows(const Tensor& x, Tensor& y);

/// argmax of each row of x: [N, K] F32 or BF16, K > 0 -> [N] on the host (ties: the smaller index;
/// rows holding NaN: unspecified). CUDA: waits for the current stream.
std::vector<int64_t> argmax_rows(const Tensor& x);

/// The TTT target of every position p of a sample (what make_ttt_sample stores):
///   l_p = W_lm z_p (logits over the full vocabulary V, fp32 accumulation),
///   target_probs[p]  = softmax(l_p[s_0], ..., l_p[s_{K-1}])  (renormalised over the draft vocabulary),
///   target_argmax[p] = argmax_v l_p[v] over all V (ties: the smaller id).
/// final_hidden: [T, H] F32/BF16 (z, after the final norm), lm_head: [V, H] F32/BF16 (W_lm),
/// selected: [K] I64 (ascending ids in [0, V)), target_probs: [T, K] F32 and target_argmax: [T] I64
/// (outputs, overwritten). All on one device. The logits are made `row_chunk` rows at a time
/// (a [row_chunk, V] fp32 buffer, reused; never [T, V]). CPU: both inputs widened to fp32, sgemm,
/// then argmax/gather/softmax per row. CUDA: matmul (cuBLASLt, fp32 accumulate) in lm_head's dtype
/// (a final_hidden of the other dtype is converted first), then one fused kernel per chunk that reads
/// each row of logits once (the argmax, and the selected logits through a [V] inverse index).
/// Throws aerie::Error on bad shapes/dtypes/devices, row_chunk < 1, or selected ids outside [0, V) or
/// not ascending (CUDA checks them on the device and reports it at the end of the call).
void target_distribution(const Tensor& final_hidden, const Tensor& lm_head, const Tensor& selected,
                         Tensor& target_probs, Tensor& target_argmax, int64_t row_chunk);

}  // namespace aerie
