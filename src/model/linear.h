// A linear layer of the target that knows its weight format (CTranslate2's Dense layer carrying its
// quantization scale): dense in the compute dtype, or kept on the device as the checkpoint ships it
// (DeepSeek-V3's block FP8, Kimi-K2.5's INT4 groups) and dequantized per call into a scratch buffer of
// the forward (never the whole model), then multiplied by the dense GEMM. docs/quantization.md.
#pragma once
#include <cstdint>
#include <vector>

#include "core/tensor.h"
#include "kernels/quant.h"

namespace aerie {

class ForwardContext;

/// The weight formats a Linear can hold (docs/quantization.md, kernels/quant.h):
///  - Dense: weight [out, in] in the compute dtype (F32 or BF16);
///  - BlockFp8: F8E4M3 weight + F32 scale_inv per 128 x 128 block (quant_method "fp8");
///  - Int4Group: compressed-tensors pack-quantized, I32 words of 8 nibbles + a BF16 scale per 32
///    columns (quant_method "compressed-tensors").
enum class WeightFormat { Dense, BlockFp8, Int4Group };
const char* weight_format_name(WeightFormat f);

/// One checkpoint tensor's part of a quantized Linear: rows [row0, row0 + rows) of the Linear's W
/// (a packed q/k/v or gate/up Linear has one part per projection), this tp rank's slice.
///  - BlockFp8: weight [R, C] F8E4M3, scale [ceil(R/128), ceil(C/128)] F32, where the slice is rows
///    [r_off, r_off + rows) and columns [c_off, c_off + in) of weight. A slice that does not start on
///    a 128 boundary is stored from the boundary before it (r_off, c_off < 128: at most 127 extra rows
///    or columns; none for DeepSeek-V3 / Kimi-K2 at tp <= 8), so every stored block keeps its scale.
///  - Int4Group: weight [rows, in/8] I32, scale [rows, in/32] BF16 (r_off = c_off = 0).
struct QuantPart {
  Tensor weight, scale;
  int64_t row0 = 0, rows = 0;
  int64_t r_off = 0, c_off = 0;
};

/// One linear layer y = x W^T (+ b), this tp rank's part: W [out, in], b [out] or undefined.
/// Column-parallel linears hold rows of W (and of b); row-parallel ones hold columns of W, and their
/// bias is replicated and added once after the all-reduce (add_bias). Made by WeightSource::load_linear.
struct Linear {
  WeightFormat format = WeightFormat::Dense;
  Tensor weight;                 // Dense: [out, in] compute dtype; quantized: undefined (see parts)
  std::vector<QuantPart> parts;  // quantized: the parts, rows in order, covering [0, out)
  Tensor bias;                   // [out] compute dtype, or undefined
  int64_t out = 0, in = 0;       // this rank's W shape

  /// One part of the W8A8 path (use_fp8_gemm): the part's F8E4M3 weight [rows, in] as stored and its
  /// scales laid out for kernels/gemm.h matmul_fp8_block; it writes columns [row0, row0 + rows) of y.
  struct Fp8GemmPart {
    Tensor weight, scale;
    int64_t row0 = 0, rows = 0;
  };
  std::vector<Fp8GemmPart> fp8_gemm;  // empty: matmul dequantizes (or the weight is Dense)
  mutable bool fp8_gemm_unsupported = false;  // cuBLASLt had no algorithm: dequantize from then on

  bool defined() const { return out > 0; }
  /// Runs this Linear's matmul as W8A8 block-FP8 GEMMs from now on, as vLLM and SGLang serve block-FP8
  /// checkpoints (docs/quantization.md "W8A8"): the input quantized per token and 128 columns
  /// (kernels/quant.h quantize_fp8_rows), the weight in 128 x 128 blocks. A Dense weight is first
  /// quantized into DeepSeek-V3's block-FP8 format (quantize_fp8_block; the format becomes BlockFp8 with
  /// one part and the dense tensor is freed, halving its memory in BF16); a BlockFp8 weight keeps its
  /// bytes. Returns false and changes nothing for INT4 weights and for FP8 parts whose slice starts
  /// inside a block (r_off or c_off != 0: the blocks would not line up with the GEMM's). Throws
  /// aerie::Error from the quantization.
  bool use_fp8_gemm();

  int64_t out_features() const { return out; }
  int64_t in_features() const { return in; }
  /// Bytes the weight holds on the device (the quantized formats: weights and scales).
  int64_t weight_bytes() const;
  /// y [n, out] (F32 or the compute dtype) = x [n, in] (compute dtype) W^T + beta y, without the bias.
  /// A quantized weight is first dequantized into the forward's scratch buffer (ForwardContext::scratch,
  /// [out, in] in the compute dtype), part by part; after use_fp8_gemm, x is quantized into scratch
  /// buffers instead and each part is one matmul_fp8_block (where cuBLASLt has no algorithm for it, a
  /// warning once and the dequantizing path from then on).
  void matmul(ForwardContext& ctx, const Tensor& x, Tensor& y, float beta = 0.0f) const;
  /// W into dst [out, in] F32 or BF16 on the weight's device: a Dense weight converted, a quantized
  /// one dequantized (the fp32 product rounded once to dst's dtype). An FP8 part whose columns do not
  /// start on a block boundary goes through a temporary [rows, C] tensor. Throws aerie::Error on a
  /// dst of another shape.
  void dequantize(Tensor& dst) const;
  /// The quantized parts' dequantizations into dst [out, in] (compute dtype, on the weight's device),
  /// appended to `items` for one kernels/quant.h dequant_batch call; a part that cannot go into a batch
  /// (an FP8 slice whose columns start inside a block) is dequantized here at once. Throws aerie::Error
  /// on a Dense weight or a dst of another shape.
  void dequant_items(Tensor& dst, std::vector<DequantItem>& items) const;
  /// y += b (nothing without a bias).
  void add_bias(ForwardContext& ctx, Tensor& y) const;
  /// matmul then add_bias.
  void forward(ForwardContext& ctx, const Tensor& x, Tensor& y) const {
    matmul(ctx, x, y);
    add_bias(ctx, y);
  }
};

/// a's rows over b's, as one Linear (q over a separately split k/v, for one GEMM): W = [W_a; W_b], b's
/// quantized parts and W8A8 parts moved down by a.out rows, biases stacked likewise (both or neither).
/// Throws aerie::Error when the two differ in format, input width, bias presence or W8A8 switch.
Linear stack_linear_rows(Linear a, Linear b);

}  // namespace aerie
