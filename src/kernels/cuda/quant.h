// The CUDA weight dequantization of kernels/quant.h. Plain C++ (no CUDA headers). Internal to src/kernels.
#pragma once
#include <cstdint>
#include <vector>

#include "core/tensor.h"

namespace aerie::cuda {

/// Device pointers, arguments checked by kernels/quant.cc: out (n1 - n0, K) F32|BF16 from the absolute
/// rows [n0, n1) of w (N, K) e4m3fn bytes and scale_inv (ceil N/128, ceil K/128). One thread per output
/// element; bitwise the CPU result. Queued on the current stream.
void dequant_fp8_block(const uint8_t* w, const float* scale_inv, int64_t n0, int64_t n1, int64_t k, void* out,
                       DType out_dtype);
/// out (n1 - n0, K) F32|BF16 from packed (N, ceil K/8) I32 and scale (N, K/group) BF16|F32. One thread per
/// output element; bitwise the CPU result. Queued on the current stream.
void dequant_int4_packed(const int32_t* packed, const void* scale, DType scale_dtype, int64_t k, int64_t group,
                         int64_t n0, int64_t n1, void* out, DType out_dtype);

/// One item of dequant_batch, device pointers (kernels/quant.h DequantItem, checked there).
struct DequantDesc {
  const void* weight = nullptr;  // FP8: (N, K) bytes; INT4: (N, ceil K/8) I32
  const void* scale = nullptr;   // FP8: (ceil N/128, ceil K/128) F32; INT4: (N, K/group) BF16|F32
  void* out = nullptr;           // (rows, K) F32|BF16
  int64_t n0 = 0, rows = 0, k = 0, group = 0;
  bool int4 = false, scale_f32 = false, out_f32 = false;
  bool vec = false;  // set by dequant_batch: 8 outputs per thread (K % 8 == 0, aligned pointers)
};
/// All items in one launch (grid y = item, grid-stride over each item's elements), bitwise the single
/// kernels; the descriptor array goes to the device with one copy. Queued on the current stream.
void dequant_batch(const std::vector<DequantDesc>& items);

/// kernels/quant.h quantize_fp8_rows on device pointers (checked there): x (m, k) F32|BF16 -> q (m, k)
/// e4m3fn bytes, scale (ceil k/128, m). One warp per (row, 128-column block). Current stream.
void quantize_fp8_rows(const void* x, DType x_dtype, int64_t m, int64_t k, uint8_t* q, float* scale);
/// kernels/quant.h quantize_fp8_block: w (n, k) F32|BF16 -> q (n, k), scale_inv (ceil n/128, ceil k/128).
/// One thread block per 128 x 128 block. Current stream.
void quantize_fp8_block(const void* w, DType w_dtype, int64_t n, int64_t k, uint8_t* q, float* scale_inv);

}  // namespace aerie::cuda
