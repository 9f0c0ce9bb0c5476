// The goldens of tools/reference/quant_router_golden.py (tests/kernels/fixtures/quant_router_golden.safetensors),
// read once per test process, for quant_test.cc and moe_router_test.cc.
#pragma once
#include <string>
#include <vector>

#include "core/bf16.h"
#include "io/safetensors.h"

namespace aerie::testing {

/// The golden file's tensors (CPU, dtypes as stored). Throws aerie::Error if a name is absent.
inline const Tensor& golden(const std::string& name) {
  static const SafetensorsFile file =
      load_safetensors(std::string(AERIE_SOURCE_DIR) + "/tests/kernels/fixtures/quant_router_golden.safetensors");
  auto it = file.tensors.find(name);
  AERIE_CHECK(it != file.tensors.end(), "quant_router_golden.safetensors has no tensor " << name);
  return it->second;
}

/// The goldens on real weights of tools/reference/real_quant_golden.py (SmolLM2-135M-Instruct matrices
/// quantized by the block-FP8 formula and by compressed-tensors; tests/kernels/fixtures/real_quant_golden.safetensors).
inline const Tensor& real_golden(const std::string& name) {
  static const SafetensorsFile file =
      load_safetensors(std::string(AERIE_SOURCE_DIR) + "/tests/kernels/fixtures/real_quant_golden.safetensors");
  auto it = file.tensors.find(name);
  AERIE_CHECK(it != file.tensors.end(), "real_quant_golden.safetensors has no tensor " << name);
  return it->second;
}

/// The goldens of tools/reference/softmax_router_golden.py (transformers' Qwen3-MoE and Mixtral routers;
/// tests/kernels/fixtures/softmax_router_golden.safetensors).
inline const Tensor& softmax_router_golden(const std::string& name) {
  static const SafetensorsFile file =
      load_safetensors(std::string(AERIE_SOURCE_DIR) + "/tests/kernels/fixtures/softmax_router_golden.safetensors");
  auto it = file.tensors.find(name);
  AERIE_CHECK(it != file.tensors.end(), "softmax_router_golden.safetensors has no tensor " << name);
  return it->second;
}

/// The raw 16-bit patterns of a BF16 tensor (any device), for bitwise comparisons.
inline std::vector<uint16_t> bf16_bits(const Tensor& t) {
  const Tensor c = t.device() == Device::CPU ? t : t.to_device(Device::CPU);
  const uint16_t* p = static_cast<const uint16_t*>(c.raw());
  return std::vector<uint16_t>(p, p + c.numel());
}

}  // namespace aerie::testing
