// Causal grouped-query attention with the row log-sum-exp, forward and flash-style backward
// (Dao et al. 2022, FlashAttention, Algorithm 2 for the backward). No T x T matrix is stored: each
// query row's scores are computed, used and dropped.
#pragma once
#include "core/tensor.h"

namespace aerie {

/// q: [Tq, n_heads, d], k, v: [Tk, n_kv, d] (F32; n_heads % n_kv == 0, head h reads kv head
/// h / (n_heads / n_kv)). Query row i attends key j iff j <= i + q_offset (q_offset = Tk - Tq for
/// decoding with a KV cache, 0 for a prefill). scale multiplies q.k (usually 1/sqrt(d)).
/// out: [Tq, n_heads, d]; lse: [Tq, n_heads] F32, natural-log sum of exp(scale q.k) over the
/// attended keys (pass nullptr when not needed).
void attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, int64_t q_offset, float scale,
                       Tensor& out, Tensor* lse);

/// Backward of the causal part given the FINAL output `out` and FINAL `lse` of each row (which may
/// merge further keys, as the TTT diagonal does): with P_ij = exp(scale q_i.k_j - lse_i),
/// D_i = dout_i . out_i, dS_ij = P_ij (dout_i . v_j - D_i):
/// dq_i = scale sum_j dS_ij k_j (OVERWRITTEN), dk_j += scale sum_i dS_ij q_i, dv_j += sum_i P_ij dout_i
/// (dk, dv ADDED to: the TTT step-0 keys/values accumulate over steps).
void attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                        const Tensor& out, const Tensor& lse, int64_t q_offset, float scale, Tensor& dq,
                        Tensor& dk, Tensor& dv);

}  // namespace aerie
