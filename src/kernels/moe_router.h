// The MoE routers (DeepSeek-V3 / Kimi-K2's sigmoid noaux_tc below; the softmax top-k of Qwen3-MoE and Mixtral:
// moe_router_softmax_topk) and the sort of
// (token, slot) pairs by expert that a grouped expert GEMM wants. The router follows transformers 5.x
// DeepseekV3TopkRouter.forward (models/deepseek_v3/modeling_deepseek_v3.py), all in fp32:
//   scores = sigmoid(logits)                          logits = the gate GEMM x W_g^T, computed in fp32
//   choice = scores + e_score_correction_bias         (selection only)
//   group score g = sum of the two largest choice values of each of n_group equal groups of experts
//   keep the topk_group groups of largest g; the experts of the other groups cannot be chosen (HF masks
//     them with -inf, as DeepSeek's inference/model.py)
//   indices = the top_k experts by choice among the kept groups
//   weights = scores[indices] (UNBIASED), / (sum + 1e-20) when norm_topk_prob, * routed_scaling_factor.
// Order and ties (aerie's rule, the same on CPU and CUDA): groups and experts are taken by decreasing
// value, equal values lower index first; indices[t] lists the chosen experts in that order. torch.topk
// (CPU, these sizes) selects with std::nth_element, so on an exact tie at the cut it keeps an arbitrary
// member (checked: not always the lower index) and HF returns the experts unsorted; with distinct
// values at the cut the chosen set is the same. docs/quantization.md has the details.
#pragma once
#include "core/tensor.h"

namespace aerie {

/// The router's config fields (config.json: n_group, topk_group, num_experts_per_tok, norm_topk_prob,
/// routed_scaling_factor). DeepSeek-V3: 8 / 4 / 8 / true / 2.5; Kimi-K2(.5): 1 / 1 / 8 / true / 2.827.
struct MoeRouterConfig {
  int64_t n_group = 1;
  int64_t topk_group = 1;
  int64_t top_k = 8;
  bool norm_topk_prob = true;
  float routed_scaling_factor = 1.0f;
};

/// logits: [T, E] F32, bias (e_score_correction_bias): [E] F32 -> indices: [T, top_k] I32 (experts in
/// decreasing choice order, ties lower index first), weights: [T, top_k] F32. Needs E % n_group == 0,
/// E / n_group >= 2, 1 <= topk_group <= n_group, 1 <= top_k <= topk_group * E / n_group. Non-finite
/// logits give unspecified (but in-range) experts. On CUDA one warp per token, queued on the current
/// stream; CPU and CUDA differ only where their expf differ in the last ulp.
/// Throws aerie::Error naming the tensor or field on a shape, dtype, device or config mismatch.
void moe_router_noaux_tc(const Tensor& logits, const Tensor& bias, const MoeRouterConfig& cfg, Tensor& indices,
                         Tensor& weights);

/// The softmax top-k router of Qwen3-MoE (norm_topk_prob as configured) and Mixtral (always renormalized):
/// transformers 5.17 Qwen3MoeTopKRouter / MixtralTopKRouter, and vLLM's fused_topk with renormalize, in fp32:
///   p = softmax(logits)  (max subtracted, then exp, summed in expert order, divided)
///   indices = the top_k experts by p (decreasing, equal p lower index first: aerie's rule, as the router above)
///   weights = p[indices], / sum(p[indices]) when cfg.norm_topk_prob (no epsilon: the sum is > 0),
///             * cfg.routed_scaling_factor (1 for both families)
/// cfg.n_group / topk_group must be 1 (no groups). logits: [T, E] F32 -> indices [T, top_k] I32, weights
/// [T, top_k] F32; 1 <= top_k <= E. Non-finite logits give unspecified (but in-range) experts. On CUDA one warp
/// per token (lane 0 sums in expert order, so CPU and CUDA differ only where their expf differ). Throws
/// aerie::Error naming the tensor or field on a shape, dtype, device or config mismatch.
void moe_router_softmax_topk(const Tensor& logits, const MoeRouterConfig& cfg, Tensor& indices, Tensor& weights);

/// Which router an MoE layer runs (MoeSpec::router): DeepSeek-V3's sigmoid + grouped noaux_tc selection with
/// e_score_correction_bias, or softmax top-k (Qwen3-MoE, Mixtral).
enum class MoeRouterKind { SigmoidNoauxTc, SoftmaxTopK };

/// The router of `kind`: moe_router_noaux_tc (bias: [E] F32) or moe_router_softmax_topk (bias unused, may be
/// undefined). Same shapes and errors as those.
void moe_router(MoeRouterKind kind, const Tensor& logits, const Tensor& bias, const MoeRouterConfig& cfg,
                Tensor& indices, Tensor& weights);

/// The (token, slot) pairs of indices [T, k] I32 grouped by expert, for a grouped GEMM:
///   counts [E] I32: pairs routed to each expert; offsets [E + 1] I32: exclusive prefix sums of counts
///   (offsets[E] = T k); perm [T k] I32: the pair ids p = t k + slot, sorted by expert, stable (ascending p
///   within an expert), so expert e's rows are perm[offsets[e] .. offsets[e+1]) and token t = p / k.
/// Indices must lie in [0, E): the CPU throws aerie::Error naming the first bad one; CUDA does not read
/// them back, drops such pairs from counts and perm and sets perm's unused tail to -1. Deterministic on
/// both (no atomics). Throws aerie::Error on a shape, dtype or device mismatch.
void moe_sort_by_expert(const Tensor& indices, int64_t num_experts, Tensor& counts, Tensor& offsets, Tensor& perm);

/// The routed sum of the expert outputs: y [T k, H] F32 holds the output of pair p = t k + slot in row p
/// (pair order), weights [T, k] F32 the router's -> out [T, H] F32 (overwritten),
///   out[t, j] = sum_{slot = 0..k-1} weights[t, slot] y[t k + slot, j]
/// in fp32, the slots in order (the same on CPU and CUDA; transformers' fp32 grouped_mm path sums the same
/// terms in another order). Throws aerie::Error on a shape, dtype or device mismatch.
void moe_combine(const Tensor& y, const Tensor& weights, Tensor& out);

/// The experts' input rows and where their outputs go, from moe_sort_by_expert's perm, on the device
/// (no host round trip): for r in [0, P), P = T k,
///   xs[r] = h[perm[r] / k]     (row r of the expert-ordered GEMM input is its pair's token),
///   row_of[perm[r]] = r        (pair p's output is row row_of[p] of the experts' output).
/// h: [T, H] F32|BF16, perm: [P] I32 (a permutation of [0, P): moe_sort_by_expert's, every pair routed),
/// xs: [P, H] in h's dtype, or undefined (then only row_of: the fused grouped GEMM reads h's rows through
/// perm itself, matmul_grouped_quant's a_rows), row_of: [P] I32. The CPU checks that perm is a permutation (naming the first
/// bad entry); CUDA trusts it (it is the sort's output). Throws aerie::Error on a shape, dtype or device
/// mismatch.
void moe_gather_pairs(const Tensor& h, const Tensor& perm, int64_t k, Tensor& xs, Tensor& row_of);

/// Expert parallelism: this rank computed only the expert-ordered rows [r0, r1) (its experts' rows, into
/// an output of r1 - r0 rows). In place, for every pair p: row_of[p] = row_of[p] - r0 when it lies in
/// [r0, r1), else -1 (moe_combine_rows then adds only this rank's pairs; the tensor-parallel all-reduce
/// sums the ranks'). row_of: [P] I32 (moe_gather_pairs'), 0 <= r0 <= r1. Throws aerie::Error on a
/// shape or dtype mismatch or a bad range.
void moe_local_rows(Tensor& row_of, int64_t r0, int64_t r1);

/// moe_combine of the experts' outputs in expert order, without gathering them back to pair order:
///   out[t, j] = sum_{slot = 0..k-1} weights[t, slot] ys[row_of[t k + slot], j]   (a row_of of -1, a pair the
///   CUDA sort dropped for an expert index out of range, adds nothing)
/// in fp32, the slots in order: bit for bit moe_combine of y[p] = ys[row_of[p]] (a BF16 ys widened
/// exactly). ys: [R, H] F32|BF16 (R = P, or after moe_local_rows the local rows' count), row_of: [P] I32
/// (moe_gather_pairs', entries -1 or < R), weights [T, k] F32, out [T, H] F32 (overwritten). Throws
/// aerie::Error on a shape, dtype or device mismatch (the CPU also on a row_of entry >= R).
void moe_combine_rows(const Tensor& ys, const Tensor& row_of, const Tensor& weights, Tensor& out);

}  // namespace aerie
