// TTT attention (eagle3.md section 4): the causal attention of a step's queries over the step-0
// keys/values (attention_forward, flash-style, returns the row log-sum-exp), merged by log-sum-exp
// with the "diagonal" keys (row i's own keys of steps 1..k: attention_merge_diagonal_forward). The
// backward is attention_backward fed the merged out and lse, plus the diagonal's elementwise backward
// (attention_merge_diagonal_backward). No T x T matrix anywhere; device-agnostic (kernels/attention.h).
#include "kernels/attention.h"
#include "model/draft_layer.h"

namespace aerie::draft_detail {

void ttt_attention_forward(const Tensor& q, const Tensor& k0, const Tensor& v0, const std::vector<const Tensor*>& diag_k,
                           const std::vector<const Tensor*>& diag_v, int64_t q_offset, float scale, int64_t window,
                           Tensor& out, Tensor& lse) {
  attention_forward(q, k0, v0, q_offset, scale, out, &lse, window);
  attention_merge_diagonal_forward(q, diag_k, diag_v, scale, out, lse);
}

void ttt_attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k0, const Tensor& v0,
                            const std::vector<const Tensor*>& diag_k, const std::vector<const Tensor*>& diag_v,
                            const Tensor& out, const Tensor& lse, float scale, int64_t window, Tensor& dq, Tensor& dk0,
                            Tensor& dv0, const std::vector<Tensor*>& ddiag_k, const std::vector<Tensor*>& ddiag_v) {
  attention_backward(dout, q, k0, v0, out, lse, 0, scale, dq, dk0, dv0, window);
  attention_merge_diagonal_backward(dout, q, diag_k, diag_v, out, lse, scale, dq, ddiag_k, ddiag_v);
}

}  // namespace aerie::draft_detail
