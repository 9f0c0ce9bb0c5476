// Helpers of the matmul_grouped_quant tests (gemm_test.cc, gemm_cuda_test.cc): random expert weights in
// each stored format, and their dequantization by the kernels/quant.h references.
#pragma once
#include <random>
#include <vector>

#include "kernel_test_util.h"
#include "kernels/gemm.h"
#include "kernels/quant.h"

namespace aerie::testing {

/// One group's weight in `format` with parts of the given row counts and K columns, seeded: Dense
/// values uniform in [-1, 1) rounded to `dense`; FP8 every e4m3fn code but the NaNs (0x7F, 0xFF) with
/// scale_inv in [1e-3, 0.1); INT4 random words (every nibble) with BF16 scales in [1e-3, 0.1).
inline GroupedWeight random_grouped_weight(GroupedWeightFormat format, const std::vector<int64_t>& rows, int64_t K,
                                           uint32_t seed, DType dense = DType::BF16) {
  GroupedWeight gw;
  std::mt19937 gen(seed);
  for (size_t p = 0; p < rows.size(); ++p) {
    const int64_t R = rows[p];
    const uint32_t s = seed * 31u + static_cast<uint32_t>(p);
    if (format == GroupedWeightFormat::Dense) {
      gw.push_back({random_tensor({R, K}, s).to(dense), {}});
    } else if (format == GroupedWeightFormat::Fp8Block) {
      Tensor w = Tensor::empty({R, K}, DType::F8E4M3);
      auto* b = static_cast<uint8_t*>(w.raw());
      for (int64_t i = 0; i < R * K; ++i) {
        uint8_t v = static_cast<uint8_t>(gen());
        if ((v & 0x7F) == 0x7F) v ^= 1;  // no NaN
        b[i] = v;
      }
      gw.push_back({w, random_tensor({(R + 127) / 128, (K + 127) / 128}, s + 1000, 1e-3f, 0.1f)});
    } else {
      Tensor w = Tensor::empty({R, (K + 7) / 8}, DType::I32);
      auto* u = static_cast<uint32_t*>(w.raw());
      for (int64_t i = 0; i < w.numel(); ++i) u[i] = static_cast<uint32_t>(gen());
      gw.push_back({w, random_tensor({R, K / kInt4GroupSize}, s + 1000, 1e-3f, 0.1f).to(DType::BF16)});
    }
  }
  return gw;
}

/// The group's W [N, K] in `dt` (F32: the exact products; BF16: rounded once), by the reference
/// dequantizations of kernels/quant.h, on the CPU.
inline Tensor dequantized(GroupedWeightFormat format, const GroupedWeight& gw, int64_t K, DType dt) {
  int64_t N = 0;
  for (const auto& p : gw) N += p.weight.dim(0);
  Tensor w = Tensor::empty({N, K}, dt);
  int64_t r0 = 0;
  for (const auto& p : gw) {
    const Tensor wp = p.weight.to_device(Device::CPU);
    const int64_t R = wp.dim(0);
    Tensor rows = w.slice(r0, r0 + R);
    if (format == GroupedWeightFormat::Dense)
      rows.copy_from(wp.to(dt));
    else if (format == GroupedWeightFormat::Fp8Block)
      dequant_fp8_block(wp, p.scale.to_device(Device::CPU), rows);
    else
      dequant_int4_packed(wp, p.scale.to_device(Device::CPU), K, kInt4GroupSize, rows);
    r0 += R;
  }
  return w;
}

/// The group's parts on the GPU.
inline GroupedWeight on_gpu(const GroupedWeight& gw) {
  GroupedWeight g;
  for (const auto& p : gw)
    g.push_back({p.weight.to_device(Device::CUDA), p.scale.defined() ? p.scale.to_device(Device::CUDA) : Tensor()});
  return g;
}

inline const char* format_name(GroupedWeightFormat f) {
  return f == GroupedWeightFormat::Dense ? "Dense" : f == GroupedWeightFormat::Fp8Block ? "Fp8Block" : "Int4Group";
}

}  // namespace aerie::testing
