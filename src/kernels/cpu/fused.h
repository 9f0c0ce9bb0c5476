// CPU references of the fused forward ops (contract in kernels/fused.h), on fp32 arrays; kernels/fused.cc
// widens BF16 tensors before and rounds BF16 outputs after. Internal to src/kernels.
#pragma once
#include <cstdint>

namespace aerie::cpu {

/// qkv (n, (nq + 2 nkv) d) -> q (n, nq, d), k (n, nkv, d), v (n, nkv, d); q_norm, k_norm (d) or both null.
void qkv_rope_forward(const float* qkv, const int32_t* positions, const float* inv_freq, const float* q_norm,
                      const float* k_norm, float eps, int64_t n, int64_t nq, int64_t nkv, int64_t d, float* q,
                      float* k, float* v);
/// gu (n, 2i) -> out (n, i).
void swiglu_packed_forward(const float* gu, int64_t n, int64_t i, float* out);
/// r (n, h) += x (n, h); y (n, h) = w (r rs).
void add_rmsnorm_forward(float* r, const float* x, const float* w, float eps, int64_t n, int64_t h, float* y);

}  // namespace aerie::cpu
