// CPU weight dequantization (kernels/quant.h): the naive reference, one output element at a time.
// Products in fp32, rounded once to BF16 by core/bf16.h (round to nearest even).
#include <cstdint>

#include "core/bf16.h"
#include "core/fp8.h"
#include "core/tensor.h"

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
