// Dequantization of the quantized weight formats of the DeepSeek-V3-architecture targets into BF16 or
// F32 (a scratch buffer for a bf16 GEMM, or a tensor-parallel slice / one expert of a weight):
//
//  - block FP8 (DeepSeek-V3, Kimi-K2; DeepSeek-V3 README_WEIGHTS.md, inference/kernel.py weight_dequant):
//      weight [N, K] float8 e4m3fn, weight_scale_inv [ceil(N/128), ceil(K/128)] F32,
//      W[n, k] = fp8(weight[n, k]) * weight_scale_inv[n / 128, k / 128]   (partial edge blocks included);
//  - compressed-tensors "pack-quantized" INT4, symmetric, group strategy (Kimi-K2.5 routed experts;
//      compressed_tensors/compressors/pack_quantized/{helpers,base}.py, 0.20.x):
//      weight_packed [N, ceil(K/8)] I32 (eight 4-bit values per word, lowest nibble first, each stored
//      as q + 8), weight_scale [N, K/group] BF16, weight_shape [2] I32|I64 = (N, K),
//      W[n, k] = q[n, k] * weight_scale[n, k / group],  q = ((word >> 4 (k % 8)) & 0xF) - 8 in [-8, 7].
//
// Both products are formed in fp32 and rounded once to the output dtype (round to nearest even):
// bitwise what transformers' FP8 dequantization ((w.float() * s).to(bf16)) and compressed-tensors'
// dequantize (q.to(bf16) * scale in bf16, i.e. an fp32 product rounded to bf16) give. A q * scale
// product is exact in fp32, so the F32 output of the INT4 op is the exact value.
// docs/quantization.md describes the formats.
#pragma once
#include <string>
#include <vector>

#include "core/tensor.h"

namespace aerie {

/// Rows and columns of one block of a block-FP8 weight (quantization_config.weight_block_size).
constexpr int64_t kFp8BlockSize = 128;
/// Columns sharing one scale in the INT4 pack-quantized format of Kimi-K2.5 (group_size).
constexpr int64_t kInt4GroupSize = 32;

/// out [n1 - n0, K] BF16|F32 = rows [n0, n1) of the dequantized block-FP8 weight.
///   weight: [N, K] F8E4M3 (or U8 holding the same bytes); scale_inv: [ceil(N/128), ceil(K/128)] F32
///   (scale rows are indexed with the absolute row n, so a range need not be block aligned).
/// 0 <= n0 <= n1 <= N. On CUDA the kernel (one thread per output element) is queued on the current stream.
/// Throws aerie::Error on a bad dtype, device mismatch, row range or out shape; a scale_inv whose shape
/// is not [ceil(N/128), ceil(K/128)] is an error naming both shapes and `name` (the tensor's name, for
/// the message; may be empty).
void dequant_fp8_block(const Tensor& weight, const Tensor& scale_inv, int64_t n0, int64_t n1, Tensor& out,
                       const std::string& name = {});
/// The whole weight: out [N, K].
void dequant_fp8_block(const Tensor& weight, const Tensor& scale_inv, Tensor& out, const std::string& name = {});

/// in_features K of a pack-quantized weight from its weight_shape tensor ([2] I32 or I64 on the CPU =
/// (N, K); compressed-tensors writes I64, the Kimi-K2.5 checkpoint holds I32), checked against
/// weight_packed [N, ceil(K/8)]. Throws aerie::Error naming `name` and the shapes when they disagree.
int64_t int4_packed_in_features(const Tensor& weight_shape, const Tensor& weight_packed,
                                const std::string& name = {});

/// out [n1 - n0, K] BF16|F32 = rows [n0, n1) of the dequantized pack-quantized INT4 weight.
///   weight_packed: [N, ceil(K/8)] I32; weight_scale: [N, K / group_size] BF16|F32 (K % group_size == 0,
///   as compressed-tensors requires); K: in_features (int4_packed_in_features); group_size >= 1.
/// 0 <= n0 <= n1 <= N. On CUDA: one thread per output element, queued on the current stream.
/// Throws aerie::Error on a bad dtype, device, row range or out shape; a weight_scale whose shape is not
/// [N, K / group_size] is an error naming both shapes and `name`.
void dequant_int4_packed(const Tensor& weight_packed, const Tensor& weight_scale, int64_t k, int64_t group_size,
                         int64_t n0, int64_t n1, Tensor& out, const std::string& name = {});
/// The whole weight: out [N, K].
void dequant_int4_packed(const Tensor& weight_packed, const Tensor& weight_scale, int64_t k, int64_t group_size,
                         Tensor& out, const std::string& name = {});

/// One dequantization of dequant_batch: rows [n0, n1) of a weight into out [n1 - n0, K] F32|BF16.
///  - int4 false: block FP8, weight [N, K] F8E4M3|U8, scale = weight_scale_inv (dequant_fp8_block);
///  - int4 true: pack-quantized INT4, weight = weight_packed [N, ceil(K/8)] I32, scale = weight_scale,
///    k = in_features (dequant_int4_packed).
/// name: the tensor's name, for error messages.
struct DequantItem {
  bool int4 = false;
  Tensor weight, scale;
  int64_t k = 0;
  int64_t n0 = 0, n1 = 0;
  Tensor out;
  std::string name;
};

/// Many dequantizations in one call (the experts of an MoE layer that got tokens, into one stacked
/// scratch buffer): the same values, bit for bit, as one dequant_fp8_block / dequant_int4_packed call per
/// item, each item checked as those calls check it. INT4 items use `group_size`. CPU: one call per item
/// (the reference). CUDA: one kernel launch for all items (grid y = item; the descriptors go to the device
/// with one small copy), on the current stream. Throws aerie::Error as the single calls do (naming the
/// item's tensor), or when the items are on different devices.
void dequant_batch(const std::vector<DequantItem>& items, int64_t group_size = kInt4GroupSize);

/// The smallest amax a W8A8 quantization block scales by (vLLM's per_token_group_quant_fp8 eps): an
/// all-zero block gets scale 1e-10 / 448 and zero codes instead of a division by zero.
constexpr float kFp8MinAmax = 1e-10f;

/// Activation quantization of the W8A8 block-FP8 GEMM (matmul_fp8_block), per token and group of 128
/// columns: DeepSeek-V3 inference/kernel.py act_quant, vLLM / SGLang per_token_group_quant_fp8 (group
/// 128, the way they serve block-FP8 checkpoints). For every row m and column block b (the last may be
/// partial):
///   s = max(amax_{k in b} |x[m, k]|, kFp8MinAmax) / 448,   q[m, k] = e4m3fn(x[m, k] / s),   scale[b, m] = s
/// with e4m3fn = core/fp8.h float_to_fp8_e4m3fn (round to nearest even, saturating at 448).
///   x: [M, K] F32|BF16; q: [M, K] F8E4M3 (or U8); scale: [ceil(K/128), M] F32, token-major within a block
///   (the layout cuBLASLt's VEC128_32F scale of the activation operand reads).
/// CPU and CUDA give the same bytes (IEEE division on both). On CUDA one warp per (row, block), queued on
/// the current stream. Throws aerie::Error on a bad shape, dtype or device.
void quantize_fp8_rows(const Tensor& x, Tensor& q, Tensor& scale);

/// Block quantization of a weight into DeepSeek-V3's block-FP8 format (the inverse of dequant_fp8_block;
/// llm-compressor's FP8_BLOCK scheme): per 128 x 128 block (edge blocks partial)
///   s = max(amax |W[block]|, kFp8MinAmax) / 448,   q = e4m3fn(W / s),   scale_inv[block] = s,
/// so dequant_fp8_block(q, scale_inv) is W within half an e4m3 ulp (2^-4 relative) of each value, or
/// 2^-10 s where e4m3 is subnormal.
///   w: [N, K] F32|BF16; q: [N, K] F8E4M3|U8; scale_inv: [ceil(N/128), ceil(K/128)] F32.
/// CPU and CUDA give the same bytes; on CUDA one thread block per 128 x 128 block. Throws aerie::Error
/// on a bad shape, dtype or device.
void quantize_fp8_block(const Tensor& w, Tensor& q, Tensor& scale_inv);

}  // namespace aerie
