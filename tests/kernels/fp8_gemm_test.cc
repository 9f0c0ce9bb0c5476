// The W8A8 block-FP8 path (kernels/quant.h quantize_fp8_rows / quantize_fp8_block, kernels/gemm.h
// matmul_fp8_block), the way vLLM and SGLang run DeepSeek-V3's block-FP8 linears:
//  - CPU: the quantizations against their definition (every block's largest value is +-448, every value
//    within half an e4m3 ulp after dequantization, zero blocks), the GEMM reference against the F32
//    matmul of the dequantized operands, columns and beta;
//  - CUDA (skipped without a GPU): the quantizations bitwise the CPU's; cuBLASLt's block-scaled GEMM
//    against the CPU reference over shapes with partial blocks, a weight-scale row padded to 4, M not a
//    multiple of 4, both output dtypes, a column offset and beta 1.
// Tolerance of the CUDA GEMM: both sum exact products of e4m3 values (4 significant bits each, so every
// product is exact in fp32), but Hopper's FP8 tensor cores keep fewer accumulator bits than fp32 inside a
// 128-column block (DeepSeek-V3 report, section 3.3.2: about 14 bits) before cuBLASLt scales and adds the
// block in fp32. A block sum of 128 terms of size |x||w| then carries up to ~2^-14 * 128 |x||w| of
// truncation, far below the quantization error itself; we bound the relative L2 error by 2e-3 (F32 out)
// and 6e-3 (BF16 out: plus bf16's 2^-9 rounding). A wrong scale layout gives errors of order 1.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <iostream>

#include "core/fp8.h"
#include "cuda_test_util.h"
#include "kernel_test_util.h"
#include "kernels/gemm.h"
#include "kernels/quant.h"

namespace aerie {
namespace {

using testing::expect_error;
using testing::random_as;

int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

/// Codes and scales of quantize_fp8_rows of x on x's device.
void quant_rows(const Tensor& x, Tensor& q, Tensor& s) {
  q = Tensor::empty(x.shape(), DType::F8E4M3, x.device());
  s = Tensor::empty({cdiv(x.dim(1), 128), x.dim(0)}, DType::F32, x.device());
  quantize_fp8_rows(x, q, s);
}

void quant_block(const Tensor& w, Tensor& q, Tensor& s) {
  q = Tensor::empty(w.shape(), DType::F8E4M3, w.device());
  s = Tensor::empty({cdiv(w.dim(0), 128), cdiv(w.dim(1), 128)}, DType::F32, w.device());
  quantize_fp8_block(w, q, s);
}

/// x (CPU) dequantized from quantize_fp8_rows' codes and scales: xq[m, k] * xs[k / 128, m].
std::vector<float> dequant_rows(const Tensor& q, const Tensor& s) {
  const int64_t m = q.dim(0), k = q.dim(1);
  std::vector<float> out(static_cast<size_t>(m * k));
  for (int64_t r = 0; r < m; ++r)
    for (int64_t j = 0; j < k; ++j)
      out[r * k + j] = fp8_e4m3fn_to_float(static_cast<const uint8_t*>(q.raw())[r * k + j]) * s.data<float>()[(j / 128) * m + r];
  return out;
}

/// Each value within half an e4m3 ulp of the original (2^-4 relative for normals; 2^-10 s absolute in the
/// subnormal range), and the largest magnitude of every group coded as +-448.
void expect_quantized_within_half_ulp(const std::vector<float>& x, const std::vector<float>& back,
                                      const std::vector<float>& scale_of, const std::string& what) {
  int bad = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const float tol = std::fabs(x[i]) * 0x1.0p-4f + scale_of[i] * 0x1.0p-10f + 1e-30f;
    if (!(std::fabs(back[i] - x[i]) <= tol) && ++bad <= 3)
      ADD_FAILURE() << what << "[" << i << "]: " << x[i] << " came back as " << back[i];
  }
  EXPECT_EQ(bad, 0) << what;
}

TEST(Fp8Quantize, RowsFollowTheDefinition) {
  for (DType dt : {DType::F32, DType::BF16}) {
    const int64_t m = 5, k = 300;  // blocks of 128, 128, 44
    Tensor x = random_as({m, k}, dt, 7, -3.0f, 3.0f);
    // Row 3 all zero: scale kFp8MinAmax / 448, codes 0.
    std::vector<float> xv = x.to_float_vector();
    for (int64_t j = 0; j < k; ++j) xv[3 * k + j] = 0.0f;
    x = Tensor::from_vector(xv, {m, k});
    if (dt == DType::BF16) x = x.to(DType::BF16);
    xv = x.to_float_vector();
    Tensor q, s;
    quant_rows(x, q, s);
    std::vector<float> scale_of(xv.size());
    for (int64_t r = 0; r < m; ++r)
      for (int64_t b = 0; b < 3; ++b) {
        float amax = 0;
        for (int64_t j = b * 128; j < std::min(k, (b + 1) * 128); ++j) amax = std::max(amax, std::fabs(xv[r * k + j]));
        const float want = std::max(amax, kFp8MinAmax) / 448.0f;
        EXPECT_EQ(s.data<float>()[b * m + r], want) << "row " << r << " block " << b;
        bool has_max = false;
        for (int64_t j = b * 128; j < std::min(k, (b + 1) * 128); ++j) {
          scale_of[r * k + j] = want;
          const uint8_t c = static_cast<const uint8_t*>(q.raw())[r * k + j];
          if (amax > 0 && std::fabs(xv[r * k + j]) == amax) has_max |= (c & 0x7F) == 0x7E;
          if (amax == 0) {
            EXPECT_EQ(c & 0x7F, 0);
          }
        }
        if (amax > 0) {
          EXPECT_TRUE(has_max) << "row " << r << " block " << b << ": the largest value is not +-448";
        }
      }
    expect_quantized_within_half_ulp(xv, dequant_rows(q, s), scale_of, std::string("rows ") + dtype_name(dt));
  }
}

TEST(Fp8Quantize, BlocksFollowTheDefinition) {
  const int64_t n = 200, k = 300;
  const Tensor w = random_as({n, k}, DType::BF16, 11, -0.05f, 0.05f);
  Tensor q, s;
  quant_block(w, q, s);
  ASSERT_EQ(s.shape(), (Shape{2, 3}));
  const std::vector<float> wv = w.to_float_vector();
  Tensor back = Tensor::empty({n, k}, DType::F32);
  dequant_fp8_block(q, s, back);
  std::vector<float> scale_of(wv.size());
  for (int64_t bi = 0; bi < 2; ++bi)
    for (int64_t bj = 0; bj < 3; ++bj) {
      float amax = 0;
      for (int64_t r = bi * 128; r < std::min(n, (bi + 1) * 128); ++r)
        for (int64_t c = bj * 128; c < std::min(k, (bj + 1) * 128); ++c) amax = std::max(amax, std::fabs(wv[r * k + c]));
      EXPECT_EQ(s.data<float>()[bi * 3 + bj], amax / 448.0f);
      for (int64_t r = bi * 128; r < std::min(n, (bi + 1) * 128); ++r)
        for (int64_t c = bj * 128; c < std::min(k, (bj + 1) * 128); ++c) scale_of[r * k + c] = amax / 448.0f;
    }
  expect_quantized_within_half_ulp(wv, back.to_float_vector(), scale_of, "blocks");
  expect_error([&] { Tensor bad = Tensor::empty({2, 2}, DType::F32); quantize_fp8_block(w, q, bad); }, "scale");
}

/// The F32 matmul of the dequantized operands: the GEMM's exact value up to fp32 summation order.
std::vector<float> dequantized_product(const Tensor& xq, const Tensor& xs, const Tensor& wq, const Tensor& ws) {
  const int64_t m = xq.dim(0), k = xq.dim(1), n = wq.dim(0);
  Tensor x = Tensor::from_vector(dequant_rows(xq, xs), {m, k});
  Tensor w = Tensor::empty({n, k}, DType::F32);
  dequant_fp8_block(wq, ws, w);
  Tensor y = Tensor::empty({m, n}, DType::F32);
  matmul(x, w, y, false, true);
  return y.to_float_vector();
}

TEST(Fp8Gemm, CpuReferenceIsTheDequantizedProduct) {
  const int64_t m = 9, n = 200, k = 300;
  Tensor xq, xs, wq, ws;
  quant_rows(random_as({m, k}, DType::BF16, 1, -2.0f, 2.0f), xq, xs);
  quant_block(random_as({n, k}, DType::BF16, 2, -0.05f, 0.05f), wq, ws);
  const Tensor wsp = fp8_gemm_weight_scale(ws, k);
  ASSERT_EQ(wsp.shape(), (Shape{2, 4}));  // 3 K blocks padded to 4
  const std::vector<float> ref = dequantized_product(xq, xs, wq, ws);
  Tensor y = Tensor::empty({m, n}, DType::F32);
  ASSERT_TRUE(matmul_fp8_block(xq, xs, wq, wsp, y));
  testing::expect_close(y.to_float_vector(), ref, 1e-5f, 1e-5f, "fp8 gemm");
  // Into columns [40, 240) of a wider y, accumulating (beta 1); the other columns untouched.
  const int64_t wide = n + 64, c0 = 40;
  Tensor y2 = random_as({m, wide}, DType::F32, 3);
  const std::vector<float> before = y2.to_float_vector();
  ASSERT_TRUE(matmul_fp8_block(xq, xs, wq, wsp, y2, c0, 1.0f));
  const std::vector<float> after = y2.to_float_vector();
  for (int64_t r = 0; r < m; ++r)
    for (int64_t c = 0; c < wide; ++c) {
      const size_t i = static_cast<size_t>(r * wide + c);
      if (c < c0 || c >= c0 + n)
        EXPECT_EQ(after[i], before[i]) << r << "," << c;
      else
        EXPECT_NEAR(after[i], before[i] + ref[r * n + c - c0], 1e-5f * (1 + std::fabs(after[i]))) << r << "," << c;
    }
  expect_error([&] { matmul_fp8_block(xq, xs, wq, ws, y); }, "ws");                   // unpadded scales
  expect_error([&] { matmul_fp8_block(xq, xs, wq, wsp, y2, wide - n + 1); }, "columns");
}

#ifdef AERIE_WITH_CUDA

using testing::gpu;

TEST(Fp8QuantizeCuda, BitwiseTheCpu) {
  AERIE_REQUIRE_CUDA();
  for (DType dt : {DType::F32, DType::BF16})
    for (auto [m, k] : {std::pair<int64_t, int64_t>{1, 128}, {37, 300}, {64, 4096}, {3, 7168}}) {
      const Tensor x = random_as({m, k}, dt, static_cast<uint32_t>(m * 131 + k), -4.0f, 4.0f);
      Tensor q, s, gq, gs;
      quant_rows(x, q, s);
      quant_rows(gpu(x), gq, gs);
      const std::string what = std::string(dtype_name(dt)) + " " + std::to_string(m) + "x" + std::to_string(k);
      EXPECT_EQ(std::memcmp(gq.to_device(Device::CPU).raw(), q.raw(), q.nbytes()), 0) << "rows codes " << what;
      EXPECT_EQ(std::memcmp(gs.to_device(Device::CPU).raw(), s.raw(), s.nbytes()), 0) << "rows scales " << what;
      quant_block(x, q, s);
      quant_block(gpu(x), gq, gs);
      EXPECT_EQ(std::memcmp(gq.to_device(Device::CPU).raw(), q.raw(), q.nbytes()), 0) << "block codes " << what;
      EXPECT_EQ(std::memcmp(gs.to_device(Device::CPU).raw(), s.raw(), s.nbytes()), 0) << "block scales " << what;
    }
}

TEST(Fp8GemmCuda, MatchesTheCpuReference) {
  AERIE_REQUIRE_CUDA();
  struct Case {
    int64_t m, n, k;
  };
  // (64, 256, 512): the plain case, which must run on an H200; the others may be refused by cuBLASLt
  // (returns false: the caller falls back), which the test prints.
  // Each case by the automatic choice and by the mma.sync e4m3 kernel (AERIE_FP8_GEMM_KERNEL=mma: the path of an
  // sm_120 GPU, where cuBLASLt has no block-scaled FP8) in its 64 x 64 and 128 x 128 tiles (mma128), which take
  // every case here (K a multiple of 16).
  for (const char* kernel : {"", "mma", "mma128"})
  for (const Case c : {Case{64, 256, 512}, Case{2048, 384, 1024}, Case{37, 384, 384}, Case{1, 576, 2048},
                       Case{128, 200, 256}}) {
    testing::ScopedEnv choice("AERIE_FP8_GEMM_KERNEL", *kernel ? kernel : nullptr);
    Tensor xq, xs, wq, ws;
    quant_rows(random_as({c.m, c.k}, DType::BF16, 5, -2.0f, 2.0f), xq, xs);
    quant_block(random_as({c.n, c.k}, DType::BF16, 6, -0.05f, 0.05f), wq, ws);
    const Tensor wsp = fp8_gemm_weight_scale(ws, c.k);
    for (DType out : {DType::F32, DType::BF16})
      for (const float beta : {0.0f, 1.0f}) {
        const int64_t wide = c.n + 128, c0 = 64;
        const Tensor y0 = random_as({c.m, wide}, out, 8);
        Tensor ref = y0.clone();
        ASSERT_TRUE(matmul_fp8_block(xq, xs, wq, wsp, ref, c0, beta));
        Tensor got = gpu(y0);
        const std::string what = std::string(*kernel ? kernel : "auto") + " " + std::to_string(c.m) + "x" +
                                 std::to_string(c.n) + "x" + std::to_string(c.k) + " -> " + dtype_name(out) + " beta " +
                                 std::to_string(beta);
        std::string why;
        const bool ran = matmul_fp8_block(gpu(xq), gpu(xs), gpu(wq), gpu(wsp), got, c0, beta, &why);
        if ((c.m == 64 && c.n == 256) || *kernel) {
          EXPECT_TRUE(ran) << what << ": " << why;
        }
        if (!ran) {
          std::cout << "[ note ] " << what << ": cuBLASLt refused (the caller falls back): " << why << "\n";
          continue;
        }
        const std::vector<float> g = got.to_float_vector(), r = ref.to_float_vector(), y0v = y0.to_float_vector();
        // The untouched columns bitwise; the written ones by relative L2 over the block.
        double num = 0, den = 0;
        int untouched_bad = 0;
        for (int64_t i = 0; i < c.m; ++i)
          for (int64_t j = 0; j < wide; ++j) {
            const size_t p = static_cast<size_t>(i * wide + j);
            if (j < c0 || j >= c0 + c.n) {
              untouched_bad += g[p] != y0v[p];
              continue;
            }
            num += (g[p] - r[p]) * (g[p] - r[p]);
            den += r[p] * r[p];
          }
        EXPECT_EQ(untouched_bad, 0) << what;
        EXPECT_LE(std::sqrt(num / den), out == DType::F32 ? 2e-3 : 6e-3) << what;
      }
  }
}

// Reports (asserts nothing about speed: benchmarks live in tools/bench) the W8A8 block-FP8 GEMM of the 8B shape's
// projections (M 4096 rows; N x K 4096 x 4096, 14336 x 4096, 4096 x 14336) by each kernel this GPU takes: cuBLASLt
// where it has block-scaled FP8, the mma.sync e4m3 kernel's 64 x 64 and 128 x 128 tiles; TFLOP/s of 2 M N K.
TEST(Fp8GemmCuda, ReportsThroughput) {
  AERIE_REQUIRE_CUDA();
  const int64_t m = 4096;
  for (auto [n, k] : {std::pair<int64_t, int64_t>{4096, 4096}, {14336, 4096}, {4096, 14336}}) {
    Tensor xq, xs, wq, ws;
    quant_rows(gpu(random_as({m, k}, DType::BF16, 5, -2.0f, 2.0f)), xq, xs);
    quant_block(gpu(random_as({n, k}, DType::BF16, 6, -0.05f, 0.05f)), wq, ws);
    const Tensor wsp = fp8_gemm_weight_scale(ws, k);
    Tensor y = Tensor::empty({m, n}, DType::BF16, Device::CUDA);
    for (const char* kernel : {"cublas", "mma", "mma128"}) {
      testing::ScopedEnv choice("AERIE_FP8_GEMM_KERNEL", kernel);
      if (!matmul_fp8_block(xq, xs, wq, wsp, y, 0, 0.0f)) {
        std::printf("[ perf ] fp8 gemm %lldx%lldx%lld %s: refused here\n", (long long)m, (long long)n, (long long)k,
                    kernel);
        continue;
      }
      cuda::synchronize();
      const int reps = 10;
      const auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < reps; ++i) matmul_fp8_block(xq, xs, wq, wsp, y, 0, 0.0f);
      cuda::synchronize();
      const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / reps;
      std::printf("[ perf ] fp8 gemm %lldx%lldx%lld %s: %.3f ms (%.1f TFLOP/s)\n", (long long)m, (long long)n,
                  (long long)k, kernel, ms, 2.0 * m * n * k / ms * 1e-9);
    }
  }
}

#endif  // AERIE_WITH_CUDA

}  // namespace
}  // namespace aerie
