// float8 e4m3fn, the weight format of DeepSeek-V3's block-FP8 checkpoints (safetensors "F8_E4M3",
// torch.float8_e4m3fn; OCP 8-bit floating point spec, E4M3): 1 sign bit, 4 exponent bits (bias 7),
// 3 mantissa bits; no infinities ("fn" = finite), NaN only at S.1111.111 (0x7F, 0xFF); max 448,
// smallest subnormal 2^-9. Decoding reads FP8 weights; encoding writes fp8 hidden-state shards
// (extract --storage fp8).
// Header-only and usable from CUDA device code (kernels/cuda/quant.cu).
#pragma once
#include <cmath>
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

/// The e4m3fn code nearest to x (round to nearest, ties to even), saturating at +-448 (the largest
/// finite value, code 0x7E / 0xFE: e4m3fn has no infinity); NaN gives 0x7F (sign kept). What torch's
/// float32 -> float8_e4m3fn cast gives for |x| <= 448 (torch saturates nothing: larger values are NaN).
/// Host and device (activation quantization of the W8A8 GEMMs, kernels/quant.h quantize_fp8_rows):
/// bitwise the same code on both.
AERIE_HOST_DEVICE inline uint8_t float_to_fp8_e4m3fn(float x) {
  uint32_t u;
  memcpy(&u, &x, 4);
  const uint8_t sign = static_cast<uint8_t>((u >> 24) & 0x80u);
  const uint32_t au = u & 0x7fffffffu;
  if (au > 0x7f800000u) return sign | 0x7Fu;  // NaN
  if (au >= 0x3c800000u) {                    // |x| >= 2^-6: a normal e4m3 value (or beyond 448)
    // Round the 23-bit mantissa to 3 bits, to nearest even (a carry moves into the exponent), then
    // rebias the exponent 127 -> 7: the code is (bits >> 20) - (120 << 3).
    const uint32_t r = au + 0x7FFFFu + ((au >> 20) & 1u);
    const uint32_t code = (r >> 20) - (120u << 3);
    return sign | static_cast<uint8_t>(code > 0x7Eu ? 0x7Eu : code);  // saturate at 448
  }
  // Subnormal: multiples of 2^-9 (code m = the multiple; 8 is the smallest normal, code 0x08).
  float a;
  memcpy(&a, &au, 4);
  return sign | static_cast<uint8_t>(rintf(a * 512.0f));  // rintf: ties to even in the default rounding mode
}

}  // namespace aerie
