// The CPU implementations of the kernel families (src/kernels/cpu/<family>.cc), called by the checked
// dispatch functions of src/kernels/<family>.cc. Arguments are already validated: raw contiguous
// row-major pointers plus sizes; shapes are given in the trailing comments. All arithmetic is fp32 with
// fp32 accumulation unless a comment says double. Not part of the public interface.
#pragma once
#include <cstdint>
#include <vector>

#include "core/bf16.h"
#include "kernels/rope.h"
#include "kernels/optim.h"

namespace aerie::cpu {

// gemm.cc: c (M, N) = alpha op(a) op(b) + beta c; a (M, K) or (K, M), b (K, N) or (N, K). cblas_sgemm.
void sgemm(const float* a, const float* b, float* c, int64_t m, int64_t n, int64_t k, bool trans_a,
           bool trans_b, float alpha, float beta);
/// bf16 a, b widened to fp32 copies, then sgemm.
void bgemm(const bf16* a, const bf16* b, float* c, int64_t m, int64_t n, int64_t k, bool trans_a,
           bool trans_b, float alpha, float beta);

// norm.cc
void rmsnorm_forward(const float* x /* (N, H) */, const float* w /* (H) */, float eps, int64_t n, int64_t h,
                     float* y /* (N, H), may alias x */, float* rstd /* (N) or nullptr */);
void rmsnorm_backward(const float* dy, const float* x, const float* w, const float* rstd, int64_t n, int64_t h,
                      float* dx /* (N, H) overwritten */, float* dw /* (H) added to, or nullptr */);

// rope.cc
std::vector<float> rope_inv_freq(const RopeParams& p, int64_t head_dim);
void rope_apply(float* x /* (T, nh, d) */, const int32_t* positions /* (T) */, const float* inv_freq /* d/2 */,
                int64_t t, int64_t nh, int64_t d, bool inverse);
void rope_apply_interleaved(float* x /* (T, nh, d) */, const int32_t* positions /* (T) */,
                            const float* inv_freq /* d/2 */, int64_t t, int64_t nh, int64_t d, float scale);

// activation.cc
void swiglu_forward(const float* gate, const float* up, float* out, int64_t n);
void swiglu_backward(const float* dout, const float* gate, const float* up, float* dgate, float* dup, int64_t n);

// embedding.cc: out (N, H) = table (V, H) [ids - row_offset]; ids already range-checked.
template <typename T>
void embedding_forward(const int32_t* ids, const T* table, float* out, int64_t n, int64_t h, int64_t row_offset);
// dtable (V, H) [ids - row_offset] += dout (N, H), in id order; ids already range-checked.
void embedding_backward(const int32_t* ids, const float* dout, float* dtable, int64_t n, int64_t h,
                        int64_t row_offset);

// attention.cc: q (Tq, nh, d), k, v (Tk, nkv, d), out (Tq, nh, d), lse (Tq, nh) or nullptr.
struct AttentionDims {
  int64_t tq, tk, nh, nkv, d, q_offset;
  float scale;
  int64_t dv = 0;  // v's and out's head dim (the forward; 0: d)
  int64_t window = 0;  // sliding window: row i attends keys (i + q_offset - window, i + q_offset]; 0: none
  int64_t vd() const { return dv > 0 ? dv : d; }
};
void attention_forward(const float* q, const float* k, const float* v, const AttentionDims& a, float* out,
                       float* lse);
void attention_backward(const float* dout, const float* q, const float* k, const float* v, const float* out,
                        const float* lse, const AttentionDims& a, float* dq, float* dk, float* dv);
// TTT diagonal merge (double precision): q, out, dout, dq (tq, nh, d), lse (tq, nh); diag_k[j], diag_v[j],
// ddiag_k[j], ddiag_v[j] (>= tq, nkv, d). a.tk and a.q_offset are unused.
void attention_merge_diagonal_forward(const float* q, const std::vector<const float*>& diag_k,
                                      const std::vector<const float*>& diag_v, const AttentionDims& a, float* out,
                                      float* lse);
void attention_merge_diagonal_backward(const float* dout, const float* q, const std::vector<const float*>& diag_k,
                                       const std::vector<const float*>& diag_v, const float* out, const float* lse,
                                       const AttentionDims& a, float* dq, const std::vector<float*>& ddiag_k,
                                       const std::vector<float*>& ddiag_v);

// loss.cc: logits, target, dlogits (N, K), weight (N).
double soft_cross_entropy(const float* logits, const float* target, const float* weight, int64_t n, int64_t k,
                          float* dlogits);
void softmax_rows(const float* x, float* y, int64_t n, int64_t k);
void argmax_rows(const float* x, int64_t n, int64_t k, int64_t* out);
/// One row chunk of target_distribution: logits (N, V) -> argmax (N) over all V (ties: smaller id),
/// probs (N, K) = softmax of the columns selected (K ids, in range).
void target_rows(const float* logits, const int64_t* selected, int64_t n, int64_t v, int64_t k, float* probs,
                 int64_t* argmax);

// optim.cc
/// grad_scale multiplies every gradient element first (fp32; the clip coefficient of
/// adamw_step_clipped, 1 = unscaled, exactly).
void adamw_step(float* param, const float* grad, float* m, float* v, int64_t n, const AdamWParams& p,
                int64_t step, float grad_scale = 1.0f);
double sum_squares(const float* x, int64_t n);
void scale_inplace(float* x, int64_t n, float s);
void add_inplace(float* y, const float* x, int64_t n);

}  // namespace aerie::cpu
