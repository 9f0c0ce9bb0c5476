// Fused ops of the target's forward (model/gqa_attention.cc, dense_ffn.cc, decoder.cc), each one pass
// over memory instead of several: the q/k/v split with Qwen3's q/k RMSNorm and RoPE, SwiGLU on the packed gate/up GEMM output,
// and the residual add followed by the next RMSNorm. The math is transformers' modeling_llama.py /
// modeling_qwen3.py (LlamaRMSNorm, apply_rotary_pos_emb with rotate_half, LlamaMLP act_fn(gate) * up,
// the decoder layer's residual adds), written as the unfused ops of norm.h, rope.h and activation.h
// compute it, so that on F32 tensors a fused op gives the bits of the unfused sequence on the CPU.
//
// Dtypes (CPU and CUDA alike): activations and weights F32 or BF16 in any combination, arithmetic fp32
// (bf16 inputs widened; each output rounded to its own dtype once, at the store). Devices: CPU (the
// reference, kernels/cpu/fused.cc) and CUDA (kernels/cuda/fused.cu).
#pragma once
#include <vector>

#include "core/tensor.h"

namespace aerie {

/// Splits the output of the packed q/k/v GEMM and rotates q and k.
/// qkv: [n, (nq + 2 nkv) d] F32|BF16, row t = [q heads 0..nq-1 | k heads 0..nkv-1 | v heads 0..nkv-1],
/// each head d contiguous values. positions: [n] I32 on qkv's device. inv_freq: d/2 host values (at
/// most 512 on CUDA; rope_inv_freq). q_norm, k_norm: [d] F32|BF16, both defined (Qwen3) or both
/// undefined. Writes q: [n, nq, d], k: [n, nkv, d], v: [n, nkv, d] (F32|BF16 each; k, v may be views
/// into a KV cache):
///   x = head vector; with norms x_j = w_j (x_j rs), rs = 1 / sqrt(mean_j x_j^2 + eps)  (q_norm on q
///   heads, k_norm on k heads; rmsnorm_forward's formula);
///   q, k: y_i = x_i c - x_{i+d/2} s, y_{i+d/2} = x_{i+d/2} c + x_i s for i < d/2, c = cos(p inv_freq_i),
///   s = sin(p inv_freq_i), p = positions[t] (rope_apply's formula);  v = x unchanged.
/// In the BF16 mode this rounds once where norm + rope round twice. Throws aerie::Error naming the
/// tensor on a shape, dtype or device mismatch, an odd d or nq not a multiple of nkv.
void qkv_rope_forward(const Tensor& qkv, const Tensor& positions, const std::vector<float>& inv_freq,
                      const Tensor& q_norm, const Tensor& k_norm, float eps, Tensor& q, Tensor& k, Tensor& v);

/// SwiGLU on the packed gate/up GEMM output: gu: [n, 2I] F32|BF16 (row = [gate 0..I-1 | up 0..I-1]) ->
/// out: [n, I] F32|BF16, out[t, j] = silu(gu[t, j]) gu[t, I + j], silu(g) = g sigmoid(g)
/// (swiglu_forward's formula). Throws aerie::Error on a shape, dtype or device mismatch.
void swiglu_packed_forward(const Tensor& gu, Tensor& out);

/// The residual add and the next RMSNorm: r += x, then y = w (r rs), rs = 1 / sqrt(mean(r^2) + eps)
/// per row (add_inplace then rmsnorm_forward). r: [n, H] F32 (updated in place), x: [n, H] F32|BF16,
/// w: [H] F32|BF16, y: [n, H] F32|BF16 (must not alias r or x). Throws aerie::Error on a shape, dtype or
/// device mismatch.
void add_rmsnorm_forward(Tensor& r, const Tensor& x, const Tensor& w, float eps, Tensor& y);

}  // namespace aerie
