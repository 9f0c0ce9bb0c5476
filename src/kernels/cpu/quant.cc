// CPU weight dequantization (kernels/quant.h): the naive reference, one output element at a time.
// Products in fp32, rounded once to BF16 by core/bf16.h (round to nearest even).
#include <cmath>
#include <cstdint>
#include <vector>

#include "core/bf16.h"
#include "core/fp8.h"
#include "core/tensor.h"
#include "kernels/quant.h"

namespace aerie::cpu {

namespace {
// out[i] = v, stored as the out dtype (F32 or BF16; checked by kernels/quant.cc).
inline void store(void* out, DType dt, int64_t i, float v) {
  if (dt == DType::F32)
    static_cast<float*>(out)[i] = v;
  else
    static_cast<uint16_t*>(out)[i] = bf16::from_float(v);
}
}  // namespace

void dequant_fp8_block(const uint8_t* w, const float* scale_inv, int64_t n0, int64_t n1, int64_t k, void* out,
                       DType out_dtype) {
  const int64_t scale_cols = (k + 127) / 128;
  for (int64_t n = n0; n < n1; ++n) {
    const float* srow = scale_inv + (n / 128) * scale_cols;
    for (int64_t j = 0; j < k; ++j)
      store(out, out_dtype, (n - n0) * k + j, fp8_e4m3fn_to_float(w[n * k + j]) * srow[j / 128]);
  }
}

void dequant_int4_packed(const int32_t* packed, const void* scale, DType scale_dtype, int64_t k, int64_t group,
                         int64_t n0, int64_t n1, void* out, DType out_dtype) {
  const int64_t words = (k + 7) / 8, groups = k / group;
  for (int64_t n = n0; n < n1; ++n) {
    for (int64_t j = 0; j < k; ++j) {
      const uint32_t word = static_cast<uint32_t>(packed[n * words + j / 8]);
      const int q = static_cast<int>((word >> (4 * (j % 8))) & 0xFu) - 8;
      const int64_t si = n * groups + j / group;
      const float s = scale_dtype == DType::F32 ? static_cast<const float*>(scale)[si]
                                                : bf16::to_float(static_cast<const uint16_t*>(scale)[si]);
      store(out, out_dtype, (n - n0) * k + j, static_cast<float>(q) * s);
    }
  }
}

}  // namespace aerie::cpu

namespace aerie::cpu {

namespace {
inline float load(const void* x, DType dt, int64_t i) {
  return dt == DType::F32 ? static_cast<const float*>(x)[i] : bf16::to_float(static_cast<const uint16_t*>(x)[i]);
}
}  // namespace

// The W8A8 quantizations and GEMM of kernels/quant.h / gemm.h, naive references; arguments checked there.
void quantize_fp8_rows(const void* x, DType x_dtype, int64_t m, int64_t k, uint8_t* q, float* scale) {
  const int64_t blocks = (k + 127) / 128;
  for (int64_t r = 0; r < m; ++r)
    for (int64_t b = 0; b < blocks; ++b) {
      const int64_t k0 = b * 128, k1 = k0 + 128 < k ? k0 + 128 : k;
      float amax = 0.0f;
      for (int64_t j = k0; j < k1; ++j) amax = std::fmax(amax, std::fabs(load(x, x_dtype, r * k + j)));
      const float s = std::fmax(amax, kFp8MinAmax) / 448.0f;
      for (int64_t j = k0; j < k1; ++j) q[r * k + j] = float_to_fp8_e4m3fn(load(x, x_dtype, r * k + j) / s);
      scale[b * m + r] = s;
    }
}

void quantize_fp8_block(const void* w, DType w_dtype, int64_t n, int64_t k, uint8_t* q, float* scale_inv) {
  const int64_t rb = (n + 127) / 128, cb = (k + 127) / 128;
  for (int64_t bi = 0; bi < rb; ++bi)
    for (int64_t bj = 0; bj < cb; ++bj) {
      const int64_t r0 = bi * 128, r1 = r0 + 128 < n ? r0 + 128 : n, c0 = bj * 128, c1 = c0 + 128 < k ? c0 + 128 : k;
      float amax = 0.0f;
      for (int64_t r = r0; r < r1; ++r)
        for (int64_t c = c0; c < c1; ++c) amax = std::fmax(amax, std::fabs(load(w, w_dtype, r * k + c)));
      const float s = std::fmax(amax, kFp8MinAmax) / 448.0f;
      for (int64_t r = r0; r < r1; ++r)
        for (int64_t c = c0; c < c1; ++c) q[r * k + c] = float_to_fp8_e4m3fn(load(w, w_dtype, r * k + c) / s);
      scale_inv[bi * cb + bj] = s;
    }
}

void matmul_fp8_block(const uint8_t* xq, const float* xs, const uint8_t* wq, const float* ws, int64_t ldws,
                      int64_t m, int64_t n, int64_t k, void* y, DType y_dtype, int64_t ldy, int64_t c0, float beta) {
  const int64_t blocks = (k + 127) / 128;
  std::vector<float> xrow(static_cast<size_t>(k));
  for (int64_t r = 0; r < m; ++r) {
    for (int64_t j = 0; j < k; ++j) xrow[static_cast<size_t>(j)] = fp8_e4m3fn_to_float(xq[r * k + j]);
    for (int64_t c = 0; c < n; ++c) {
      const uint8_t* wrow = wq + c * k;
      float acc = 0.0f;
      for (int64_t b = 0; b < blocks; ++b) {
        const int64_t k0 = b * 128, k1 = k0 + 128 < k ? k0 + 128 : k;
        float dot = 0.0f;
        for (int64_t j = k0; j < k1; ++j) dot += xrow[static_cast<size_t>(j)] * fp8_e4m3fn_to_float(wrow[j]);
        acc += xs[b * m + r] * ws[(c / 128) * ldws + b] * dot;
      }
      const int64_t i = r * ldy + c0 + c;
      if (beta != 0.0f) acc += beta * load(y, y_dtype, i);
      store(y, y_dtype, i, acc);
    }
  }
}

}  // namespace aerie::cpu
