// The two ops of MLA's absorbed decode (model/mla_attention.cc; DeepSeek-V2 paper section 2.1.2,
// "absorb W^UK into W^Q and W^UV into W^O"; vLLM's MLACommonImpl decode path): a strided batched GEMM
// that reads every head's slice of a [rows, heads, dim] activation or of kv_b's [heads (nope + v), lora]
// weight in place, and the causal softmax of a latent-attention score matrix whose rows are (token,
// head) pairs. Arithmetic in fp32; CPU is the reference, CUDA is tested against it.
#pragma once
#include <cstdint>

#include "core/tensor.h"

namespace aerie {

/// A matrix inside a tensor, for matmul_strided_batched: batch b's matrix starts at element
/// offset + b * stride of `t` (viewed flat), its rows are `ld` elements apart (row-major).
struct MatrixView {
  const Tensor* t = nullptr;
  int64_t offset = 0, ld = 0, stride = 0;
};

/// For b < batch: C_b [m, n] = A_b [m, k] op(B_b), op(B_b) = B_b^T for B_b [n, k] (trans_b) or B_b [k, n];
/// every matrix a MatrixView (C's tensor is written). a and b share one dtype, F32 or BF16; c is F32 or
/// the inputs' dtype (one rounding of the fp32 result). All on one device. C's matrices must not overlap
/// each other or the inputs. CPU: per batch the matrices gathered into fp32 copies, cblas_sgemm, result
/// scattered (rounded once). CUDA: one cublasGemmStridedBatchedEx (CUBLAS_COMPUTE_32F) on the current
/// stream. Throws aerie::Error on a dtype/device mismatch, an ld smaller than the row, or a view that
/// reaches outside its tensor (naming a, b or c).
void matmul_strided_batched(const MatrixView& a, const MatrixView& b, const MatrixView& c, int64_t m, int64_t n,
                            int64_t k, int64_t batch, bool trans_b);

/// Causal softmax of latent-attention scores, rows (token i, head h) at r = i * group + h:
///   p[r, j] = exp(scale s[r, j] - max) / sum over j <= first_pos + r / group, 0 for the other keys
/// (query token i sits at position first_pos + i and attends keys 0 .. first_pos + i).
/// scores [R, L] F32; p [R, L] F32 or BF16 (rounded once); R % group == 0 and first_pos + R / group <= L.
/// fp32 arithmetic; CPU: one pass per row; CUDA: one block per row. Throws aerie::Error on shapes, dtypes or
/// devices that do not fit.
void causal_softmax_rows(const Tensor& scores, float scale, int64_t group, int64_t first_pos, Tensor& p);

/// The expanded form's keys and values of MLA (prefill): from kv = kv_b(c) [L, nh (nope + vd)] and the
/// latents lat [L, lora + rope] (roped k_pe in its last rope columns),
///   K [L, nh, nope + rope]: K[l, h] = [kv[l, h, :nope] | lat[l, lora:]]  (one shared rope key),
///   V [L, nh, dv]:          V[l, h] = [kv[l, h, nope:] | 0]              (dv >= vd: zero-padded to the q/k head dim).
/// All one dtype (any float) and device; K, V overwritten. CPU: loops; CUDA: one grid-stride kernel.
/// Throws aerie::Error on shapes, dtypes or devices that do not fit.
void mla_expand_kv(const Tensor& kv, const Tensor& lat, int64_t nope, int64_t vd, int64_t lora, Tensor& K, Tensor& V);

}  // namespace aerie
