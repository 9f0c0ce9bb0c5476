// float8 e4m3fn, the weight format of DeepSeek-V3's block-FP8 checkpoints (safetensors "F8_E4M3",
// torch.float8_e4m3fn; OCP 8-bit floating point spec, E4M3): 1 sign bit, 4 exponent bits (bias 7),
// 3 mantissa bits; no infinities ("fn" = finite), NaN only at S.1111.111 (0x7F, 0xFF); max 448,
// smallest subnormal 2^-9. Decode only: aerie reads FP8 weights, it does not write them.
// Header-only and usable from CUDA device code (kernels/cuda/quant.cu).
#pragma once
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define AERIE_HOST_DEVICE __host__ __device__
#else
#define AERIE_HOST_DEVICE
#endif

namespace aerie {

/// The fp32 bit pattern of the e4m3fn code `c`. Exact for all 256 codes and bitwise torch's
/// float8_e4m3fn -> float32 cast: +-0 keep their sign, subnormals m * 2^-9, and the NaN codes
/// 0x7F / 0xFF give 0x7FF00000 / 0xFFF00000 (a quiet NaN, sign kept).
AERIE_HOST_DEVICE inline uint32_t fp8_e4m3fn_to_f32_bits(uint8_t c) {
  const uint32_t sign = static_cast<uint32_t>(c & 0x80u) << 24;
  const uint32_t e = (c >> 3) & 0xFu, m = c & 0x7u;
  if (e == 0xFu && m == 0x7u) return sign | 0x7FF00000u;  // NaN
  if (e == 0) {
    if (m == 0) return sign;  // +-0
    // Subnormal m * 2^-9: the leading 1 of m at bit p becomes the implicit bit of a normal fp32.
    const uint32_t p = m >= 4 ? 2u : (m >= 2 ? 1u : 0u);
    const uint32_t frac = (m << (3 - p)) & 0x7u;
    return sign | ((p + 118u) << 23) | (frac << 20);  // exponent p - 9, biased by 127
  }
  return sign | ((e + 120u) << 23) | (m << 20);  // rebias 7 -> 127
}

/// The value of the e4m3fn code `c` as fp32 (see fp8_e4m3fn_to_f32_bits).
AERIE_HOST_DEVICE inline float fp8_e4m3fn_to_float(uint8_t c) {
  const uint32_t u = fp8_e4m3fn_to_f32_bits(c);
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

}  // namespace aerie
