// The CUDA matmul of kernels/gemm.h (cuBLASLt). Plain C++ (no CUDA headers) so that the dispatch in
// kernels/gemm.cc compiles with g++. Internal to src/kernels.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "kernels/gemm.h"

namespace aerie::cuda {

/// c (M, N) = alpha op(a) op(b) + beta c on the current stream, row-major, as kernels/gemm.h documents;
/// a, b, c are CUDA tensors already checked there (a, b: F32 or BF16 alike; c: F32, or BF16 for BF16
/// a, b). fp32 compute (CUBLAS_COMPUTE_32F, no TF32). Returns once queued. Throws aerie::Error on a
/// cuBLASLt failure, naming the status and the shapes.
void matmul(const Tensor& a, const Tensor& b, Tensor& c, int64_t m, int64_t n, int64_t k, bool trans_a,
            bool trans_b, float alpha, float beta);

/// Whether matmul searches each large shape's cuBLASLt algorithm by timing (gemm.cu's header comment):
/// AERIE_GEMM_SEARCH=1 on, =0 off, unset the built-in default (off). Read once per process. Throws
/// aerie::Error on another value.
bool gemm_search_mode();

/// Turns the search on or off for the rest of the process, over AERIE_GEMM_SEARCH (tests, benchmarks).
/// Plans already made keep their algorithm.
void set_gemm_search_mode(bool on);

/// One algorithm search of matmul: the shape (row-major M, N, K, dtypes "bf16->f32", transposes), how
/// many candidates the heuristic offered, the index of the one kept (0: the heuristic's first), and the
/// mean time of one run of the heuristic's first and of the kept one, in milliseconds.
struct GemmSearchRecord {
  int64_t m = 0, n = 0, k = 0;
  std::string dtypes;
  bool trans_a = false, trans_b = false;
  int candidates = 0, chosen = -1;
  double first_ms = 0.0, best_ms = 0.0;
};

/// Every search of this process so far (all threads and GPUs), in the order they ran.
std::vector<GemmSearchRecord> gemm_search_report();

}  // namespace aerie::cuda

namespace aerie::cuda {

/// kernels/gemm.h matmul_grouped on the current stream, arguments checked there: `groups` lists the
/// non-empty groups g (rows [offsets[g], offsets[g + 1]) of a and c, weight w[g] [N, K]). One
/// cublasGemmGroupedBatchedEx call (one problem per group, CUBLAS_COMPUTE_32F). Throws aerie::Error on
/// a cuBLAS failure, naming the status and the shapes.
void matmul_grouped(const Tensor& a, const std::vector<Tensor>& w, const std::vector<int64_t>& offsets,
                    const std::vector<int64_t>& groups, Tensor& c);

}  // namespace aerie::cuda

namespace aerie::cuda {

/// kernels/gemm.h matmul_grouped_quant's fused kernel on the current stream, arguments checked there
/// (and grouped_quant_fused_unsupported empty): `format` a GroupedWeightFormat, `groups` the non-empty
/// groups. Tiles of 64 or 128 rows of a, chosen from the groups' row counts (AERIE_GROUPED_GEMM_BM=64|128
/// forces one, for benchmarks), by 128 columns of c with wgmma, all warps loading and multiplying
/// (sm_90a; the default), or mma.sync (AERIE_GROUPED_GEMM_KERNEL=mma; also off compute capability 9.0 or
/// without sm_90a code), or by 256 columns in a warp-specialized wgmma kernel (where N and every part's
/// rows are multiples of 256: the default for BF16 weights, =ws for every format, =wgmma never); FP8 and INT4
/// weights: dequantized into registers as the tensor cores' A operand, the tokens as B, with wgmma (=rs, the
/// default on sm_90a) or mma.sync (=rsm, the default elsewhere; =mma keeps variant 1); the tile list and the groups' part
/// pointers go to the device with one small copy. Throws aerie::Error on a launch failure or more
/// than 65535 row tiles.
void matmul_grouped_quant(const Tensor& a, int format, const std::vector<GroupedWeight>& w,
                          const std::vector<int64_t>& offsets, const std::vector<int64_t>& groups, Tensor& c,
                          const int32_t* a_rows = nullptr, int row_div = 1);

}  // namespace aerie::cuda

namespace aerie::cuda {

/// kernels/gemm.h matmul_fp8_block on device pointers, checked there: y (m, n) with row stride ldy
/// (already offset to its first column) = x (m, k) e4m3 . w (n, k) e4m3 ^T with the VEC128_32F scales xs
/// (ceil k/128, m) and the BLK128x128_32F scales ws (ceil n/128, round_up(ceil k/128, 4)), + beta y.
/// One cublasLtMatmul on the current stream (fp32 accumulation, the scales applied per 128 of K).
/// Returns false, queuing nothing, when cuBLASLt has no algorithm for it (`why`, when given, then says
/// what cuBLASLt answered). Throws aerie::Error on a cuBLASLt failure.
bool matmul_fp8_block(const void* xq, const float* xs, const void* wq, const float* ws, int64_t m, int64_t n, int64_t k,
                      void* y, DType y_dtype, int64_t ldy, float beta, std::string* why = nullptr);

/// Whether matmul_fp8_block_mma takes these operands: a GPU of sm_89 or later (as gpu_limits() reports it, so
/// AERIE_CUDA_EMULATE counts), K a multiple of 16, xq and wq 16-byte aligned.
bool fp8_mma_ok(const void* xq, const void* wq, int64_t k);

/// matmul_fp8_block's math on mma.sync e4m3 (gemm_fp8_mma.cu), the same arguments: the path of GPUs where
/// cuBLASLt has no block-scaled FP8 kernel (sm_89, sm_120). `wide`: the 128 x 128 kernel (96 KiB of shared memory,
/// 8 warps) instead of the 64 x 64 one. Queued on the current stream. Throws aerie::Error unless fp8_mma_ok, where
/// the GPU's shared memory per block is below 96 KiB (wide), or on a launch failure.
void matmul_fp8_block_mma(const void* xq, const float* xs, const void* wq, const float* ws, int64_t m, int64_t n,
                          int64_t k, void* y, DType y_dtype, int64_t ldy, float beta, bool wide = false);

}  // namespace aerie::cuda
