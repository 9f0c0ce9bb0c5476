// matmul on CUDA (cuBLASLt) against the CPU matmul on the same inputs, over shapes with odd sizes, every
// transpose combination, F32 and BF16 inputs, F32 and BF16 outputs, and alpha/beta; plus the CPU's BF16
// output (the reference of the CUDA one).
#include <cmath>
#include <cstring>
#include <limits>
#include <cstdlib>
#include <sstream>
#include <utility>

#include "core/settings.h"
#include "cuda_test_util.h"
#include "grouped_quant_util.h"
#include "kernel_test_util.h"
#include "kernels/embedding.h"
#include "kernels/gemm.h"
#ifdef AERIE_WITH_CUDA
#include "kernels/cuda/gemm.h"
#endif

namespace aerie {
namespace {

using testing::random_tensor;

Tensor abs_of(const Tensor& t) {
  Tensor r = Tensor::empty(t.shape(), DType::F32);
  const auto v = t.to_float_vector();
  for (size_t i = 0; i < v.size(); ++i) r.data<float>()[i] = std::fabs(v[i]);
  return r;
}

/// EXPECTs |got - ref| <= tol_i elementwise, reporting the first few failures.
void expect_within(const std::vector<float>& got, const std::vector<float>& ref, const std::vector<float>& tol,
                   const std::string& what) {
  ASSERT_EQ(got.size(), ref.size()) << what;
  int bad = 0;
  for (size_t i = 0; i < got.size(); ++i)
    if (!(std::fabs(got[i] - ref[i]) <= tol[i]) && ++bad <= 5)
      ADD_FAILURE() << what << "[" << i << "]: got " << got[i] << ", want " << ref[i] << " +- " << tol[i];
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << got.size() << " elements out of tolerance";
}

struct Dims {
  int64_t m, n, k;
};

// Tolerance. Both devices get the same inputs (bf16 inputs are the same bf16 values), and a product of two
// bf16 values is exact in fp32, so CPU and GPU differ only by the order and blocking of the fp32 sums
// (and FMA contraction). Any summation order of K terms errs by at most (K - 1) u S with
// S = sum_p |a_ip b_pj| and u = 2^-24; tensor cores may truncate instead of round inside an MMA step
// (error up to 2u per addition), so the two results differ by at most ~3 K u S, plus a few roundings of
// alpha * acc + beta * c: tol = (3 K + 8) u (|alpha| S + |beta c0|). A real bug (a wrong transpose, a
// missing K block, a dropped alpha or beta) moves results by O(S / K) or more, i.e. ~K^2 / 3 times this
// (>= 100x for K >= 17). A BF16 c adds one bf16 ulp (<= 2^-7 |ref|): the two fp32 results may sit on
// either side of a rounding boundary. For K = 1 the only difference is the final rounding.
std::vector<float> tolerance(const Tensor& a, const Tensor& b, const Tensor& c0, bool ta, bool tb, float alpha,
                             float beta, int64_t k) {
  Tensor s = Tensor::zeros(c0.shape(), DType::F32);
  matmul(abs_of(a), abs_of(b), s, ta, tb);  // S = |a| |b| in fp32 (its own error is ~K u S, negligible)
  const auto sv = s.to_float_vector(), cv = c0.to_float_vector();
  constexpr double u = 1.0 / (1 << 24);
  std::vector<float> tol(sv.size());
  for (size_t i = 0; i < sv.size(); ++i) {
    const double scale = std::fabs(alpha) * sv[i] + std::fabs(beta) * std::fabs(cv[i]);
    tol[i] = static_cast<float>((3.0 * k + 8.0) * u * scale);
  }
  return tol;
}

TEST(MatmulCuda, MatchesCpuOverShapesTransposesDtypes) {
  AERIE_REQUIRE_CUDA();
  const Dims shapes[] = {{1, 1, 1}, {17, 33, 65}, {256, 512, 384}, {1000, 37, 129}};
  struct Types {
    DType ab, c;
  };
  const Types types[] = {{DType::F32, DType::F32}, {DType::BF16, DType::F32}, {DType::BF16, DType::BF16}};
  uint32_t seed = 100;
  for (const Dims& d : shapes)
    for (const Types& ty : types)
      for (int t = 0; t < 4; ++t)
        for (auto [alpha, beta] : {std::pair{1.0f, 0.0f}, std::pair{0.75f, -1.5f}}) {
          const bool ta = t & 1, tb = t & 2;
          std::ostringstream name;
          name << "M=" << d.m << " N=" << d.n << " K=" << d.k << " " << dtype_name(ty.ab) << "->"
               << dtype_name(ty.c) << " trans_a=" << ta << " trans_b=" << tb << " alpha=" << alpha
               << " beta=" << beta;
          SCOPED_TRACE(name.str());
          Tensor a = random_tensor(ta ? Shape{d.k, d.m} : Shape{d.m, d.k}, ++seed).to(ty.ab);
          Tensor b = random_tensor(tb ? Shape{d.n, d.k} : Shape{d.k, d.n}, ++seed).to(ty.ab);
          Tensor c0 = random_tensor({d.m, d.n}, ++seed, -2.0f, 2.0f).to(ty.c);
          Tensor ref = c0.clone();
          matmul(a, b, ref, ta, tb, alpha, beta);
          Tensor c = c0.to_device(Device::CUDA);
          matmul(a.to_device(Device::CUDA), b.to_device(Device::CUDA), c, ta, tb, alpha, beta);
          ASSERT_EQ(c.device(), Device::CUDA);
          auto tol = tolerance(a, b, c0, ta, tb, alpha, beta, d.k);
          const auto refv = ref.to_float_vector();
          if (ty.c == DType::BF16)
            for (size_t i = 0; i < tol.size(); ++i) tol[i] += 0x1p-7f * std::fabs(refv[i]);
          expect_within(c.to_float_vector(), refv, tol, name.str());
        }
}

TEST(MatmulCuda, LinearLayerIsDeterministic) {
  AERIE_REQUIRE_CUDA();
  Tensor x = random_tensor({300, 192}, 1).to(DType::BF16).to_device(Device::CUDA);
  Tensor w = random_tensor({130, 192}, 2).to(DType::BF16).to_device(Device::CUDA);
  Tensor y1 = Tensor::empty({300, 130}, DType::BF16, Device::CUDA);
  Tensor y2 = Tensor::empty({300, 130}, DType::BF16, Device::CUDA);
  matmul(x, w, y1, false, true);
  matmul(x, w, y2, false, true);
  const Tensor h1 = y1.to_device(Device::CPU), h2 = y2.to_device(Device::CPU);
  EXPECT_EQ(std::memcmp(h1.raw(), h2.raw(), h1.nbytes()), 0);
}

TEST(MatmulCuda, BetaZeroDoesNotReadC) {
  AERIE_REQUIRE_CUDA();
  // BLAS semantics: with beta = 0, c is written, never read (NaN garbage in c must not leak).
  Tensor a = random_tensor({9, 5}, 3), b = random_tensor({5, 7}, 4);
  Tensor ref = Tensor::zeros({9, 7}, DType::F32);
  matmul(a, b, ref, false, false);
  std::vector<float> nan(63, std::numeric_limits<float>::quiet_NaN());
  Tensor c = Tensor::from_vector(nan, {9, 7}).to_device(Device::CUDA);
  matmul(a.to_device(Device::CUDA), b.to_device(Device::CUDA), c, false, false, 1.0f, 0.0f);
  testing::expect_close(c.to_float_vector(), ref.to_float_vector(), 1e-5f, 1e-5f, "c");  // K = 5: ~5 u
}

TEST(MatmulCuda, UnalignedViewsAndEmptyInnerDimension) {
  AERIE_REQUIRE_CUDA();
  // Row slices start at odd element offsets (pointers only 2- or 4-byte aligned): the plan must not
  // assume cuBLASLt's default 256-byte alignment.
  for (DType dt : {DType::F32, DType::BF16}) {
    SCOPED_TRACE(dtype_name(dt));
    Tensor a = random_tensor({12, 7}, 5).to(dt), b = random_tensor({8, 7}, 6).to(dt);
    Tensor ad = a.to_device(Device::CUDA), bd = b.to_device(Device::CUDA);
    Tensor cbig = Tensor::zeros({12, 5}, DType::F32, Device::CUDA);
    Tensor c = cbig.slice(1, 12);  // (11, 5) starting at element 5
    matmul(ad.slice(1, 12), bd.slice(3, 8), c, false, true);
    Tensor ref = Tensor::zeros({11, 5}, DType::F32);
    matmul(a.slice(1, 12), b.slice(3, 8), ref, false, true);
    testing::expect_close(c.to_float_vector(), ref.to_float_vector(), 1e-5f, 1e-5f, "c");  // K = 7
  }
  // K = 0: c = beta c, on both dtypes of c.
  Tensor a = Tensor::empty({3, 0}, DType::BF16, Device::CUDA);
  Tensor b = Tensor::empty({0, 2}, DType::BF16, Device::CUDA);
  for (DType dt : {DType::F32, DType::BF16}) {
    Tensor c = Tensor::from_vector<float>({1, 2, 3, 4, 5, 6}, {3, 2}).to(dt).to_device(Device::CUDA);
    matmul(a, b, c, false, false, 1.0f, 0.5f);
    EXPECT_EQ(c.to_float_vector(), (std::vector<float>{0.5f, 1, 1.5f, 2, 2.5f, 3}));
    matmul(a, b, c, false, false, 1.0f, 0.0f);
    EXPECT_EQ(c.to_float_vector(), std::vector<float>(6, 0.0f));
  }
}

// The CPU BF16 output (the reference of the CUDA one, and of a CPU-only build).
#ifdef AERIE_WITH_CUDA
// The algorithm search (kernels/cuda/gemm.cu, AERIE_GEMM_SEARCH): a shape of >= 1 GFLOP called with
// beta 0 is searched once (one record), its result still matches the CPU within the tolerance above; a
// second M of the same power-of-two bucket reuses the winner (no new record); a beta != 0 call of a new
// shape does not search (its c is read and must not be overwritten) and still accumulates right.
TEST(MatmulCuda, AlgorithmSearchKeepsResultsAndSearchesOncePerBucket) {
  AERIE_REQUIRE_CUDA();
  cuda::set_gemm_search_mode(true);
  struct Restore {
    ~Restore() { cuda::set_gemm_search_mode(false); }
  } restore;
  const int64_t n = 1536, k = 1024;  // 2 M N K >= 1e9 for M >= 318
  uint32_t seed = 900;
  auto check = [&](int64_t m, float beta, size_t want_records, const char* what) {
    SCOPED_TRACE(what);
    Tensor a = random_tensor({m, k}, ++seed).to(DType::BF16), b = random_tensor({n, k}, ++seed).to(DType::BF16);
    Tensor c0 = random_tensor({m, n}, ++seed, -2.0f, 2.0f);
    Tensor ref = c0.clone();
    matmul(a, b, ref, false, true, 1.0f, beta);
    Tensor c = c0.to_device(Device::CUDA);
    matmul(a.to_device(Device::CUDA), b.to_device(Device::CUDA), c, false, true, 1.0f, beta);
    expect_within(c.to_float_vector(), ref.to_float_vector(), tolerance(a, b, c0, false, true, 1.0f, beta, k), what);
    EXPECT_EQ(cuda::gemm_search_report().size(), want_records);
  };
  const size_t before = cuda::gemm_search_report().size();
  check(700, 0.0f, before + 1, "M 700 (bucket 1024): searched");
  const cuda::GemmSearchRecord r = cuda::gemm_search_report().back();  // a copy: the report is returned by value
  EXPECT_EQ(r.m, 700);
  EXPECT_EQ(r.n, n);
  EXPECT_GE(r.chosen, 0);
  EXPECT_GT(r.best_ms, 0.0);
  EXPECT_LE(r.best_ms, r.first_ms * 1.0001);  // the heuristic's first is a candidate
  check(1000, 0.0f, before + 1, "M 1000 (bucket 1024): the winner reused, no search");
  check(1100, 0.5f, before + 1, "M 1100, beta 0.5: no search, c accumulated");
  check(1100, 0.0f, before + 2, "M 1100, beta 0 (bucket 2048): searched now");
  check(100, 0.0f, before + 2, "M 100: below 1 GFLOP, not searched");
}
#endif

TEST(MatmulBf16Output, CpuRoundsTheFp32ResultOnce) {
  const int64_t m = 6, n = 5, k = 40;
  Tensor a = random_tensor({m, k}, 7).to(DType::BF16), b = random_tensor({n, k}, 8).to(DType::BF16);
  for (float beta : {0.0f, 0.5f}) {
    Tensor c0 = random_tensor({m, n}, 9).to(DType::BF16);
    Tensor f = c0.to(DType::F32);  // fp32 c with the same (bf16) values
    matmul(a, b, f, false, true, 2.0f, beta);
    Tensor c = c0.clone();
    matmul(a, b, c, false, true, 2.0f, beta);
    ASSERT_EQ(c.dtype(), DType::BF16);
    const Tensor want = f.to(DType::BF16);
    EXPECT_EQ(std::memcmp(c.raw(), want.raw(), c.nbytes()), 0) << "beta " << beta;
  }
  // F32 inputs need an F32 c.
  Tensor af = random_tensor({m, k}, 7), bf = random_tensor({k, n}, 8);
  Tensor cb = Tensor::zeros({m, n}, DType::BF16);
  testing::expect_error([&] { matmul(af, bf, cb, false, false); }, "matmul: c");
}

// The grouped GEMM of the MoE experts (one cuBLAS grouped call) against the CPU's one GEMM per group:
// 40 groups of 0 to 300 rows (many empty, as most experts of a short batch), F32 and BF16, with the
// tolerance of `tolerance` per group (and one bf16 ulp for BF16 c); rows outside every group untouched.
TEST(MatmulGroupedCuda, MatchesCpu) {
  AERIE_REQUIRE_CUDA();
  const int64_t K = 129, N = 96, G = 40;
  std::vector<int64_t> offsets = {5};
  for (int64_t g = 0; g < G; ++g) offsets.push_back(offsets.back() + (g % 3 == 0 ? 0 : (g * 37) % 301));
  const int64_t P = offsets.back() + 3;
  for (DType dt : {DType::F32, DType::BF16}) {
    SCOPED_TRACE(dtype_name(dt));
    const Tensor a = random_tensor({P, K}, 300).to(dt);
    std::vector<Tensor> w, wg;
    for (int64_t g = 0; g < G; ++g) {
      w.push_back(random_tensor({N, K}, static_cast<uint32_t>(301 + g)).to(dt));
      wg.push_back(w.back().to_device(Device::CUDA));
    }
    Tensor c = Tensor::zeros({P, N}, dt);
    Tensor cg = c.to_device(Device::CUDA);
    matmul_grouped(a, w, offsets, c);
    matmul_grouped(a.to_device(Device::CUDA), wg, offsets, cg);
    const auto got = cg.to_device(Device::CPU).to_float_vector(), ref = c.to_float_vector();
    for (int64_t g = 0; g < G; ++g) {
      const int64_t r0 = offsets[g], r1 = offsets[g + 1];
      if (r0 == r1) continue;
      const Tensor c0 = Tensor::zeros({r1 - r0, N}, DType::F32);
      std::vector<float> tol = tolerance(a.slice(r0, r1).to(DType::F32), w[g].to(DType::F32), c0, false, true, 1.0f,
                                         0.0f, K);
      for (size_t i = 0; i < tol.size(); ++i)
        if (dt == DType::BF16) tol[i] += std::ldexp(std::fabs(ref[r0 * N + i]), -7);
      expect_within(std::vector<float>(got.begin() + r0 * N, got.begin() + r1 * N),
                    std::vector<float>(ref.begin() + r0 * N, ref.begin() + r1 * N), tol,
                    "group " + std::to_string(g));
    }
    for (int64_t j = 0; j < 5 * N; ++j) ASSERT_EQ(got[j], 0.0f) << "row " << j / N << " is in no group";
  }
}

// matmul_grouped_quant's fused kernels: a variant (AERIE_GROUPED_GEMM_KERNEL: auto, ws, wgmma, mma.sync, rs or rsm) and
// a tile height (AERIE_GROUPED_GEMM_BM) for one scope.
class ScopedKernel {
 public:
  ScopedKernel(const char* kernel, const char* bm) {
    setenv("AERIE_GROUPED_GEMM_KERNEL", kernel, 1);
    aerie::reload_settings();
    setenv("AERIE_GROUPED_GEMM_BM", bm, 1);
    aerie::reload_settings();
  }
  ~ScopedKernel() {
    unsetenv("AERIE_GROUPED_GEMM_KERNEL");
    aerie::reload_settings();
    unsetenv("AERIE_GROUPED_GEMM_BM");
    aerie::reload_settings();
  }
};
// ws (warp-specialized, 256-column tiles) takes groups whose parts are multiples of 256 rows; other
// shapes fall back to wgmma. auto (the default): ws for BF16 weights, rs for FP8 and INT4 (off sm_90a: rsm for both).
// rs (register-sourced, quantized formats; BF16 falls back to wgmma): token tiles of up to 256, 128, 64 rows.
// rsm (register-sourced mma.sync, quantized formats; BF16 falls back to wgmma): token tiles of up to 128, 64 rows.
constexpr std::pair<const char*, const char*> kKernels[] = {
    {"auto", "mixed"}, {"ws", "128"}, {"ws", "64"},  {"ws", "mixed"}, {"wgmma", "128"}, {"wgmma", "64"},
    {"mma", "128"},    {"mma", "64"}, {"rs", "mixed"}, {"rs", "128"},  {"rs", "64"},
    {"rsm", "mixed"},  {"rsm", "64"}};

// The fused kernel's dequantization, bit for bit: a = the K x K identity (one group, K = 192 rows: one
// full and one partial tile of 128, three of 64) makes c = W^T exactly (each c element is one product
// w * 1 plus zeros, rounded to bf16: w itself), so c must equal kernels/quant.h's BF16 dequantization
// bitwise, for each format, two parts per group (gate/up of 128 or 256 rows each), every kernel and tile height. A -0
// weight (FP8 code 0x80) gives +0 (+0 + -0 in the fp32 sum): zeros of either sign count as equal.
TEST(MatmulGroupedQuantCuda, DequantizesBitwise) {
  AERIE_REQUIRE_CUDA();
  using F = GroupedWeightFormat;
  const int64_t K = 192;
  Tensor eye = Tensor::zeros({K, K}, DType::F32);
  for (int64_t i = 0; i < K; ++i) eye.data<float>()[i * K + i] = 1.0f;
  const Tensor a = testing::gpu(eye.to(DType::BF16));
  for (const int64_t part : {128, 256})  // 256: a part over two FP8 block rows
  for (F f : {F::Dense, F::Fp8Block, F::Int4Group})
    for (const auto& [kernel, bm] : kKernels) {
      SCOPED_TRACE(std::string(testing::format_name(f)) + " " + kernel + " BM " + bm + " parts of " + std::to_string(part));
      const ScopedKernel scoped(kernel, bm);
      const int64_t N = 2 * part;
      const GroupedWeight w = testing::random_grouped_weight(f, {part, part}, K, 77);
      const std::vector<GroupedWeight> wg = {testing::on_gpu(w)};
      Tensor c = Tensor::zeros({K, N}, DType::BF16, Device::CUDA);
      ASSERT_EQ(grouped_quant_fused_unsupported(a, f, wg, {0, K}, c), "");
      matmul_grouped_quant(a, f, wg, {0, K}, c);
      const Tensor got = c.to_device(Device::CPU), want = testing::dequantized(f, w, K, DType::BF16);
      const auto* g = static_cast<const uint16_t*>(got.raw());
      const auto* r = static_cast<const uint16_t*>(want.raw());
      int64_t bad = 0;
      for (int64_t k = 0; k < K; ++k)
        for (int64_t n = 0; n < N; ++n)
          if (g[k * N + n] != r[n * K + k] && !(((g[k * N + n] | r[n * K + k]) & 0x7fff) == 0) && ++bad <= 3)
            ADD_FAILURE() << "W[" << n << ", " << k << "]: bits " << g[k * N + n] << ", want " << r[n * K + k];
      EXPECT_EQ(bad, 0);
    }
}

// The fused kernel against the CPU reference on random data: 11 groups of 0 to 300 rows (partial tiles,
// empty groups, a group of one row; 96 and 128: variant 5's tallest k-split tile and a token-split one), K 512 (8 k tiles: more than the pipeline's stages), 128 (two:
// fewer) and 1024 (16 k tiles: INT4's W blocks of 4 k tiles in variants 4 and 5 reuse their two slots), N 384 as parts 256 + 128 and 512 as 256 + 256, every format, every kernel and tile height (ws takes the 256 + 256 parts); the tolerance of MatchesCpu
// (fp32 summation order) plus one bf16 ulp of the result; rows outside every group untouched.
TEST(MatmulGroupedQuantCuda, MatchesCpu) {
  AERIE_REQUIRE_CUDA();
  using F = GroupedWeightFormat;
  const std::vector<int64_t> sizes = {0, 1, 63, 64, 65, 130, 0, 300, 17, 96, 128};
  std::vector<int64_t> offsets = {3};
  for (int64_t m : sizes) offsets.push_back(offsets.back() + m);
  const int64_t P = offsets.back() + 2, G = static_cast<int64_t>(sizes.size());
  // Parts 256 + 128 (N 384) and 256 + 256 (N 512).
  for (const std::vector<int64_t>& parts : {std::vector<int64_t>{256, 128}, std::vector<int64_t>{256, 256}})
  for (int64_t K : {512, 128, 1024})
    for (F f : {F::Dense, F::Fp8Block, F::Int4Group}) {
      const int64_t N = parts[0] + parts[1];
      std::vector<GroupedWeight> w, wg;
      for (int64_t g = 0; g < G; ++g) {
        w.push_back(testing::random_grouped_weight(f, parts, K, static_cast<uint32_t>(200 + g)));
        wg.push_back(testing::on_gpu(w.back()));
      }
      const Tensor a = random_tensor({P, K}, 300).to(DType::BF16);
      Tensor c = Tensor::zeros({P, N}, DType::BF16);
      matmul_grouped_quant(a, f, w, offsets, c);
      const auto ref = c.to_float_vector();
      for (const auto& [kernel, bm] : kKernels) {
        SCOPED_TRACE(std::string(testing::format_name(f)) + " K " + std::to_string(K) + " N " + std::to_string(N) + " " +
                     kernel + " BM " + bm);
        const ScopedKernel scoped(kernel, bm);
        const Tensor ag = testing::gpu(a);
        Tensor cg = Tensor::zeros({P, N}, DType::BF16, Device::CUDA);
        ASSERT_EQ(grouped_quant_fused_unsupported(ag, f, wg, offsets, cg), "");
        matmul_grouped_quant(ag, f, wg, offsets, cg);
        const auto got = cg.to_device(Device::CPU).to_float_vector();
        for (int64_t g = 0; g < G; ++g) {
          const int64_t r0 = offsets[g], r1 = offsets[g + 1];
          if (r0 == r1) continue;
          const Tensor wd = testing::dequantized(f, w[g], K, DType::BF16).to(DType::F32);
          const Tensor c0 = Tensor::zeros({r1 - r0, N}, DType::F32);
          std::vector<float> tol = tolerance(a.slice(r0, r1).to(DType::F32), wd, c0, false, true, 1.0f, 0.0f, K);
          for (size_t i = 0; i < tol.size(); ++i) tol[i] += std::ldexp(std::fabs(ref[r0 * N + i]), -7);
          expect_within(std::vector<float>(got.begin() + r0 * N, got.begin() + r1 * N),
                        std::vector<float>(ref.begin() + r0 * N, ref.begin() + r1 * N), tol,
                        "group " + std::to_string(g));
        }
        for (int64_t j = 0; j < 3 * N; ++j) ASSERT_EQ(got[j], 0.0f) << "row " << j / N << " is in no group";
        for (int64_t j = (P - 2) * N; j < P * N; ++j) ASSERT_EQ(got[j], 0.0f) << "row " << j / N << " is in no group";
      }
    }
}

// Shapes the fused kernel does not take (K 96, parts of 40 + 24 rows, F32) go through the fallback on
// the GPU with the same results as the CPU.
TEST(MatmulGroupedQuantCuda, OtherShapesFallBack) {
  AERIE_REQUIRE_CUDA();
  using F = GroupedWeightFormat;
  const int64_t K = 96, N = 64;
  const std::vector<int64_t> offsets = {0, 5, 5, 37};
  for (DType dt : {DType::BF16, DType::F32}) {
    std::vector<GroupedWeight> w, wg;
    for (uint32_t g = 0; g < 3; ++g) {
      w.push_back(testing::random_grouped_weight(F::Int4Group, {40, 24}, K, 40 + g));
      wg.push_back(testing::on_gpu(w.back()));
    }
    const Tensor a = random_tensor({37, K}, 9).to(dt);
    Tensor c = Tensor::zeros({37, N}, dt), cg = Tensor::zeros({37, N}, dt, Device::CUDA);
    const Tensor ag = testing::gpu(a);
    EXPECT_NE(grouped_quant_fused_unsupported(ag, F::Int4Group, wg, offsets, cg), "");
    matmul_grouped_quant(a, F::Int4Group, w, offsets, c);
    matmul_grouped_quant(ag, F::Int4Group, wg, offsets, cg);
    testing::expect_close(cg.to_device(Device::CPU).to_float_vector(), c.to_float_vector(), 1e-4f,
                          dt == DType::F32 ? 1e-5f : 1e-2f, dtype_name(dt));
  }
}

// a_rows: the fused kernel reading the tokens' rows through the MoE's permutation (row r = a[perm[r] / k])
// gives bitwise what it gives on the rows gathered first, for every format and kernel (parts of 256 rows: ws takes them); the CPU
// reference likewise.
TEST(MatmulGroupedQuantCuda, ReadsRowsThroughARows) {
  AERIE_REQUIRE_CUDA();
  using F = GroupedWeightFormat;
  const int64_t T = 97, k = 3, P = T * k, K = 256, N = 512;
  std::vector<int32_t> perm(static_cast<size_t>(P));
  for (int64_t i = 0; i < P; ++i) perm[i] = static_cast<int32_t>((i * 101 + 7) % P);  // a permutation (gcd 1)
  const std::vector<int64_t> offsets = {0, 40, 40, 170, P};
  std::vector<int32_t> src(static_cast<size_t>(P));
  for (int64_t r = 0; r < P; ++r) src[r] = perm[r] / static_cast<int32_t>(k);
  const Tensor a = random_tensor({T, K}, 3).to(DType::BF16);
  Tensor xs = Tensor::empty({P, K}, DType::BF16);
  embedding_forward(Tensor::from_vector(src, {P}), a, xs);
  const Tensor pc = Tensor::from_vector(perm, {P}), pg = testing::gpu(pc);
  for (F f : {F::Dense, F::Fp8Block, F::Int4Group}) {
    std::vector<GroupedWeight> w, wg;
    for (uint32_t g = 0; g < 4; ++g) {
      w.push_back(testing::random_grouped_weight(f, {256, 256}, K, 60 + g));
      wg.push_back(testing::on_gpu(w.back()));
    }
    Tensor c1 = Tensor::zeros({P, N}, DType::BF16), c2 = Tensor::zeros({P, N}, DType::BF16);
    matmul_grouped_quant(xs, f, w, offsets, c1);
    matmul_grouped_quant(a, f, w, offsets, c2, &pc, k);
    EXPECT_EQ(c2.to_float_vector(), c1.to_float_vector()) << testing::format_name(f) << " CPU";
    for (const auto& [kernel, bm] : kKernels) {
      const ScopedKernel scoped(kernel, bm);
      Tensor g1 = Tensor::zeros({P, N}, DType::BF16, Device::CUDA), g2 = Tensor::zeros({P, N}, DType::BF16, Device::CUDA);
      matmul_grouped_quant(testing::gpu(xs), f, wg, offsets, g1);
      matmul_grouped_quant(testing::gpu(a), f, wg, offsets, g2, &pg, k);
      EXPECT_EQ(g2.to_device(Device::CPU).to_float_vector(), g1.to_device(Device::CPU).to_float_vector())
          << testing::format_name(f) << " " << kernel << " BM " << bm;
    }
  }
}

}  // namespace
}  // namespace aerie
