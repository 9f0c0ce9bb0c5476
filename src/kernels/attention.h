// Causal grouped-query attention with the row log-sum-exp, forward and flash-style backward
// (Dao et al. 2022, FlashAttention, Algorithm 2 for the backward; Dao 2023, FlashAttention-2), the packed
// variable-length prefill, and the log-sum-exp merge of the TTT "diagonal" keys (eagle3.md section 4).
// No T x T matrix is stored: scores are computed per key tile, used and dropped.
//
// Dtypes: q, k, v (and the diagonal keys/values) are all F32 or all BF16; out, dout, dq have q's dtype;
// lse is F32; the key/value gradients (dk, dv, ddiag_k, ddiag_v) are F32 or q's dtype. Arithmetic is
// fp32 with fp32 accumulation (CPU: BF16 tensors are widened to fp32 copies, results rounded back).
// Devices: CPU (the reference) and CUDA (kernels/cuda/attention.cu; head dim <= 256 there).
#pragma once
#include <vector>

#include "core/tensor.h"

namespace aerie {

/// q: [Tq, n_heads, d], k: [Tk, n_kv, d], v: [Tk, n_kv, dv] with 1 <= dv <= d (dv < d: MLA's value head
/// of 128 against its query/key head of 192) (n_heads % n_kv == 0, head h reads kv head
/// h / (n_heads / n_kv)). Query row i attends key j iff j <= i + q_offset (q_offset = Tk - Tq for
/// decoding with a KV cache, 0 for a prefill) and, with a sliding window W > 0, j > i + q_offset - W
/// (the row's own key and the W - 1 before it: vLLM's and transformers' sliding_window, speculators'
/// `kv_idx > q_idx - sliding_window`); window 0: no lower bound. scale multiplies q.k (usually 1/sqrt(d)).
/// out: [Tq, n_heads, dv]; lse: [Tq, n_heads] F32, natural-log sum of exp(scale q.k) over the
/// attended keys (pass nullptr when not needed). A row that attends no key gets out 0, lse -inf.
/// Throws aerie::Error on mismatched shapes/dtypes/devices.
/// Throws aerie::Error for a negative window.
void attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, int64_t q_offset, float scale,
                       Tensor& out, Tensor* lse, int64_t window = 0);

/// Batched decoding against per-sequence KV caches (generate's continuous batching: a per-sequence
/// attention_forward costs a launch or two per sequence and layer, which bounds a decoding step of many
/// short sequences). q: [N, n_heads, d]; for each sequence i, query row rows[i] (distinct, < N) attends keys
/// j < lengths[i] of its own cache k[i] ([>= lengths[i], n_kv, d]) and v[i] ([>= lengths[i], n_kv, dvv] with
/// dvv >= dv, of which the first dv values of each value head are read: MLA's latent cache [L, 1, kv_lora +
/// rope] serves as both, dv = kv_lora), with a window W > 0 only keys j >= lengths[i] - W. The row sits at
/// position lengths[i] - 1, its own key already in the cache, so for dvv == dv this is
///   attention_forward(q row, k[i].slice(0, L), v[i].slice(0, L), L - 1, scale, out row, nullptr, W),  L = lengths[i].
/// out: [N, n_heads, dv] in q's dtype; rows[i] of it are written, every other row is left unchanged.
/// q, every k[i], v[i] and out all F32 or all BF16, on one device. CPU: exactly the call above per sequence
/// (for dvv > dv on a copy of the value columns). CUDA (kernels/cuda/attention_decode.cu): one launch per 64
/// sequences, one block per (sequence, head), fp32 softmax and accumulation (summation order differs from
/// attention_forward's). Throws aerie::Error on mismatched shapes/dtypes/devices, a row out of range or
/// repeated, a length outside [1, the cache's rows], a negative window, or n_heads not a multiple of n_kv.
void attention_decode_batch(const Tensor& q, const std::vector<int64_t>& rows, const std::vector<const Tensor*>& k,
                            const std::vector<const Tensor*>& v, const std::vector<int64_t>& lengths, float scale,
                            Tensor& out, int64_t window = 0);

/// Backward of the causal part given the FINAL output `out` and FINAL `lse` of each row (which may
/// merge further keys, as the TTT diagonal does): with P_ij = exp(scale q_i.k_j - lse_i),
/// D_i = dout_i . out_i, dS_ij = P_ij (dout_i . v_j - D_i):
/// dq_i = scale sum_j dS_ij k_j (OVERWRITTEN), dk_j += scale sum_i dS_ij q_i, dv_j += sum_i P_ij dout_i
/// (dk, dv ADDED to: the TTT step-0 keys/values accumulate over steps). j runs over the keys row i
/// attends: the same q_offset and window as the forward.
void attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                        const Tensor& out, const Tensor& lse, int64_t q_offset, float scale, Tensor& dq,
                        Tensor& dk, Tensor& dv, int64_t window = 0);

/// Packed variable-length causal prefill: B samples concatenated along dim 0. q: [N, n_heads, d],
/// k: [N, n_kv, d], v: [N, n_kv, dv] (dv <= d), cu_seqlens: [B+1] I32 on q's device, cu_seqlens[0] = 0 <= ... <= cu_seqlens[B] = N;
/// rows cu_seqlens[b] .. cu_seqlens[b+1]-1 form sample b, and each row attends only the keys of its own
/// sample up to itself (attention_forward with q_offset 0 per sample). out: [N, n_heads, dv]; lse: [N,
/// n_heads] F32 or nullptr. The CPU checks cu_seqlens and throws; CUDA does not read it back to the host
/// (the kernel clamps each boundary into [0, N], so a bad table gives wrong rows, never a bad access).
void attention_forward_varlen(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& cu_seqlens,
                              float scale, Tensor& out, Tensor* lse);

/// TTT diagonal merge (eagle3.md section 4), in place on the causal result: row i of q ([n, n_heads, d])
/// also attends row i of every diag_k[j] / diag_v[j] ([>= n, n_kv, d]; head h reads kv head
/// h / (n_heads / n_kv)): with s_j = scale q_i . kd_j,i and lse_c, out_c the causal values on entry,
///   lse = log(exp(lse_c) + sum_j exp(s_j)),  out = exp(lse_c - lse) out_c + sum_j exp(s_j - lse) vd_j,i.
/// out: [n, n_heads, d], lse: [n, n_heads] F32, both updated. No diagonal: nothing changes.
void attention_merge_diagonal_forward(const Tensor& q, const std::vector<const Tensor*>& diag_k,
                                      const std::vector<const Tensor*>& diag_v, float scale, Tensor& out,
                                      Tensor& lse);

/// Its backward from the MERGED out/lse: with P_j = exp(s_j - lse), D = dout . out,
/// dS_j = P_j (dout . vd_j - D): dq += scale sum_j dS_j kd_j (ADDED to: attention_backward wrote the
/// causal part first), ddiag_k[j] += scale dS_j q, ddiag_v[j] += P_j dout (rows 0..n-1, ADDED to; each
/// gradient has its diagonal tensor's shape).
void attention_merge_diagonal_backward(const Tensor& dout, const Tensor& q, const std::vector<const Tensor*>& diag_k,
                                       const std::vector<const Tensor*>& diag_v, const Tensor& out,
                                       const Tensor& lse, float scale, Tensor& dq,
                                       const std::vector<Tensor*>& ddiag_k, const std::vector<Tensor*>& ddiag_v);

}  // namespace aerie
