// GEMM: c = alpha * op(a) @ op(b) + beta * c, row-major. Reference: BLAS sgemm semantics.
// CPU: cblas_sgemm (OpenBLAS) for F32; BF16 inputs are widened to fp32 (fp32 accumulation); a BF16 c is
// widened to fp32, computed, and rounded to nearest even once at the end.
// CUDA: cuBLASLt with CUBLAS_COMPUTE_32F (true fp32 arithmetic, no TF32) and fp32 alpha/beta, so results
// match the CPU up to fp32 summation order (and, for a BF16 c, the final bf16 rounding).
#pragma once
#include <string>
#include <vector>

#include "core/tensor.h"

namespace aerie {

/// a: [M, K] (or [K, M] when trans_a), b: [K, N] (or [N, K] when trans_b), c: [M, N]; all 2-D, same
/// device. a and b have one dtype, F32 or BF16; c is F32, or BF16 when a and b are BF16 (then the fp32
/// result alpha op(a) op(b) + beta c is rounded to bf16 once). K = 0 gives c = beta c.
/// A linear layer y = x W^T is matmul(x, W, y, false, true).
/// On CUDA the call is queued on the current stream (core/device.h) and returns at once.
/// Throws aerie::Error on mismatched shapes/dtypes/devices, and on CUDA on a cuBLASLt failure (with the
/// cuBLAS status string and the shapes).
void matmul(const Tensor& a, const Tensor& b, Tensor& c, bool trans_a, bool trans_b, float alpha = 1.0f,
            float beta = 0.0f);

}  // namespace aerie

namespace aerie {

/// One line on matmul's cuBLASLt algorithm searches so far (kernels/cuda/gemm.cu, AERIE_GEMM_SEARCH=1):
/// shapes searched, how many kept another algorithm than the heuristic's first, and the summed time of
/// one run of every searched shape with the heuristic's first against the kept ones (ms). Empty when no
/// search ran (the search off, a CPU-only build, or no shape large enough).
std::string gemm_search_summary();

/// Grouped GEMM (the routed experts of an MoE layer, rows sorted by expert): for every group g with
/// rows [offsets[g], offsets[g + 1]) of a and c,
///   c[rows] = a[rows] @ w[g]^T,      a [P, K], w[g] [N, K] (one N, K, dtype and device for all g), c [P, N].
/// offsets: G + 1 non-decreasing host values with offsets[G] <= P (rows outside every group are left
/// as they are); empty groups are skipped and their w[g] may be undefined. a, w, c share one dtype, F32
/// or BF16 (a BF16 c holds the fp32 result rounded once to bf16), and one device.
/// CPU: one GEMM per non-empty group (the reference). CUDA: one cublasGemmGroupedBatchedEx call over
/// the non-empty groups (fp32 compute, no TF32), queued on the current stream; its pointer arrays go
/// to the device with one small copy.
/// Throws aerie::Error on mismatched shapes, dtypes or devices (naming the group), on offsets that are
/// not non-decreasing or exceed P, and on CUDA on a cuBLAS failure (status and shapes).
void matmul_grouped(const Tensor& a, const std::vector<Tensor>& w, const std::vector<int64_t>& offsets, Tensor& c);

}  // namespace aerie

namespace aerie {

/// How the weights of matmul_grouped_quant are stored (the formulas: kernels/quant.h).
enum class GroupedWeightFormat { Dense, Fp8Block, Int4Group };

/// One block of rows of a group's weight W [N, K]; a group's parts, in order, cover its N rows (a
/// packed gate/up weight has one part per projection). With R = weight.dim(0), the part's row count:
///  - Dense: weight [R, K] in a's dtype; scale undefined;
///  - Fp8Block: weight [R, K] F8E4M3 (or U8 with the same bytes), scale = weight_scale_inv
///    [ceil(R/128), ceil(K/128)] F32 (its block rows start at the part's row 0);
///  - Int4Group: weight = weight_packed [R, ceil(K/8)] I32, scale = weight_scale [R, K/32] BF16 or F32.
struct GroupedWeightPart {
  Tensor weight, scale;
};
/// A group's weight: its parts.
using GroupedWeight = std::vector<GroupedWeightPart>;

/// The grouped GEMM of the routed experts with their weights as stored (kernels/quant.h formats): for
/// every group g with rows [offsets[g], offsets[g + 1]) of a and c,
///   c[rows] = a[rows] @ D(W_g)^T,   a [P, K] F32|BF16, W_g [N, K] (its parts), c [P, N] in a's dtype,
/// where D dequantizes to a's dtype (each fp32 product rounded once, as dequant_fp8_block /
/// dequant_int4_packed; Dense parts as they are): the values of dequant_batch into a scratch buffer
/// followed by matmul_grouped, up to the order of the fp32 sums. Offsets as matmul_grouped (G + 1
/// non-decreasing host values, rows outside every group untouched; empty groups skipped, their weights
/// may be empty).
/// CPU: per non-empty group one dequantization into a temporary [N, K] and one GEMM (the reference).
/// Every non-empty group has the same part layout (part count, part rows, scale dtype), as the experts of
/// one MoE projection do.
/// CUDA, when grouped_quant_fused_unsupported() is empty: the fused kernel, one launch for the 128-row
/// tiles and one for the 64-row ones (bf16 tensor cores, wgmma on sm_90a else mma.sync, fp32
/// accumulation; the quantized tile of W is dequantized in shared memory between its load and its use, so
/// W stays compressed in device memory and is read once per 64 or 128 rows of a; on sm_90a FP8 and INT4
/// weights are dequantized into registers instead, read once per up to 256 rows: grouped_gemm.cu's
/// variant 4); otherwise per group a dequantization into a temporary and one cuBLASLt GEMM (slow, for any
/// shape).
/// Queued on the current stream. Throws aerie::Error on mismatched shapes, dtypes or devices (naming the
/// group and part), offsets as matmul_grouped, and on CUDA on a launch failure.
/// a_rows (optional): the rows of a gathered on the fly: row r of the GEMM's input is a[a_rows[r] / row_div]
/// (a_rows [P] I32 on a's device, every entry of a grouped row in [0, a.dim(0) row_div); a [T, K] with any
/// T): the MoE passes the tokens' hidden states with moe_sort_by_expert's perm and top_k, instead of a
/// [P, K] copy in expert order. The CPU gathers first; CUDA reads the rows in place.
void matmul_grouped_quant(const Tensor& a, GroupedWeightFormat format, const std::vector<GroupedWeight>& w,
                          const std::vector<int64_t>& offsets, Tensor& c, const Tensor* a_rows = nullptr,
                          int64_t row_div = 1);

/// Why the CUDA fused kernel of matmul_grouped_quant cannot take these operands (empty if it can):
/// it needs BF16 a and c, K a positive multiple of 64, N % 128 == 0, at most 4 parts per group of
/// rows % 128 == 0, BF16 INT4 scales, 32-bit sizes, and a and the weights 16-byte aligned (scales and
/// c 4). Checks the first non-empty group's parts (the others must match them, which
/// matmul_grouped_quant checks). No device work.
std::string grouped_quant_fused_unsupported(const Tensor& a, GroupedWeightFormat format,
                                            const std::vector<GroupedWeight>& w, const std::vector<int64_t>& offsets,
                                            const Tensor& c);

}  // namespace aerie

namespace aerie {

/// Row stride of the weight scales matmul_fp8_block takes: ceil(K/128) rounded up to a multiple of 4
/// (cuBLASLt's BLK128x128_32F layout; PyTorch's _scaled_mm checks the same padding).
int64_t fp8_weight_scale_ld(int64_t k);

/// The W8A8 block-FP8 GEMM, as vLLM and SGLang run DeepSeek-V3's block-FP8 linears (DeepSeek-V3
/// inference/kernel.py fp8_gemm; vLLM w8a8_block_fp8_matmul): into columns [c0, c0 + N) of y [M, Ny],
///   y[m, c0 + n] = sum_b xs[b, m] ws[n / 128, b] (sum_{k in block b} fp8(xq[m, k]) fp8(wq[n, k])) + beta y[m, c0 + n]
/// over the 128-column blocks b of K (the last may be partial).
///   xq [M, K] F8E4M3|U8 and xs [ceil(K/128), M] F32: quantize_fp8_rows (kernels/quant.h) of the input;
///   wq [N, K] F8E4M3|U8: a block-FP8 weight; ws [ceil(N/128), fp8_weight_scale_ld(K)] F32: its
///   weight_scale_inv with each row padded (fp8_gemm_weight_scale);
///   y [M, Ny] F32|BF16, 0 <= c0, c0 + N <= Ny.
/// CPU: the naive reference (each block's dot product in fp32, scaled, the blocks summed in order).
/// CUDA: on sm_90 / sm_100 one cuBLASLt matmul with VEC128_32F / BLK128x128_32F scales (cuBLAS >= 12.9; fp32
/// accumulation per block); on other GPUs of sm_89 or later, or where cuBLASLt refuses the operands, the mma.sync
/// e4m3 kernel (kernels/cuda/gemm_fp8_mma.cu; AERIE_FP8_GEMM_KERNEL=cublas / mma / mma128 picks one); on the current
/// stream. Returns false and queues nothing when neither takes the operands (K % 16 != 0, odd alignments, a GPU
/// before sm_89): the caller falls back to dequantization. Returns true when done (CPU) or queued.
/// Throws aerie::Error on mismatched shapes, dtypes or devices, and on a cuBLASLt failure.
/// why (optional): on false, what cuBLASLt answered (for the caller's warning).
bool matmul_fp8_block(const Tensor& xq, const Tensor& xs, const Tensor& wq, const Tensor& ws, Tensor& y,
                      int64_t c0 = 0, float beta = 0.0f, std::string* why = nullptr);

/// A weight_scale_inv [ceil(N/128), ceil(K/128)] F32 laid out for matmul_fp8_block: rows padded to
/// fp8_weight_scale_ld(K) (the padding 0); the tensor itself when no padding is needed. Same device.
Tensor fp8_gemm_weight_scale(const Tensor& scale_inv, int64_t k);

}  // namespace aerie
