// bfloat16 storage type for the CPU backend: conversion with round-to-nearest-even (the rounding of
// PyTorch's tensor.to(torch.bfloat16) and CUDA's __float2bfloat16_rn), NaN kept quiet.
#pragma once
#include <cstdint>
#include <cstring>

namespace aerie {

struct bf16 {
  uint16_t bits = 0;

  bf16() = default;
  explicit bf16(float f) : bits(from_float(f)) {}
  explicit operator float() const { return to_float(bits); }

  static uint16_t from_float(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // NaN
    u += 0x7fffu + ((u >> 16) & 1u);
    return static_cast<uint16_t>(u >> 16);
  }
  static float to_float(uint16_t b) {
    uint32_t u = static_cast<uint32_t>(b) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
};
static_assert(sizeof(bf16) == 2);

/// Rounds an fp32 value to the nearest bf16 and back (what storing as bf16 does to a value).
inline float round_bf16(float f) { return bf16::to_float(bf16::from_float(f)); }

}  // namespace aerie
