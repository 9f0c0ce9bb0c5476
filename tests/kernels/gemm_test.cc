// matmul against a double-precision reference over every transpose combination, bf16 inputs, and errors.
#include "kernels/gemm.h"

#include <cmath>
#include <tuple>

#include "grouped_quant_util.h"
#include "kernel_test_util.h"

namespace aerie {
namespace {

using testing::random_tensor;

/// c = alpha op(a) op(b) + beta c0 in double.
std::vector<float> ref_gemm(const Tensor& a, const Tensor& b, const Tensor& c0, bool ta, bool tb, double alpha,
                            double beta) {
  const auto av = a.to_float_vector(), bv = b.to_float_vector(), cv = c0.to_float_vector();
  const int64_t m = c0.dim(0), n = c0.dim(1), k = ta ? a.dim(0) : a.dim(1);
  std::vector<float> out(static_cast<size_t>(m * n));
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double s = 0.0;
      for (int64_t p = 0; p < k; ++p) {
        const double x = ta ? av[p * m + i] : av[i * k + p];
        const double y = tb ? bv[j * k + p] : bv[p * n + j];
        s += x * y;
      }
      out[i * n + j] = static_cast<float>(alpha * s + beta * cv[i * n + j]);
    }
  return out;
}

class MatmulTest : public ::testing::TestWithParam<std::tuple<bool, bool, DType>> {};

TEST_P(MatmulTest, MatchesDoubleReference) {
  const auto [ta, tb, dtype] = GetParam();
  const int64_t m = 5, n = 7, k = 33;
  Tensor a = random_tensor(ta ? Shape{k, m} : Shape{m, k}, 1);
  Tensor b = random_tensor(tb ? Shape{n, k} : Shape{k, n}, 2);
  if (dtype == DType::BF16) {  // the reference gets the same bf16-rounded inputs
    a = a.to(DType::BF16);
    b = b.to(DType::BF16);
  }
  for (auto [alpha, beta] : {std::pair{1.0f, 0.0f}, std::pair{0.5f, 2.0f}}) {
    Tensor c = random_tensor({m, n}, 3);
    const auto ref = ref_gemm(a, b, c, ta, tb, alpha, beta);
    matmul(a, b, c, ta, tb, alpha, beta);
    // fp32 accumulation over K = 33 terms of size <= 1: error ~ 33 * 6e-8
    testing::expect_close(c.to_float_vector(), ref, 1e-5f, 1e-5f, "c");
  }
}

INSTANTIATE_TEST_SUITE_P(AllTransposes, MatmulTest,
                         ::testing::Combine(::testing::Bool(), ::testing::Bool(),
                                            ::testing::Values(DType::F32, DType::BF16)));

TEST(Matmul, LinearLayerAndDeterminism) {
  // y = x W^T, the linear-layer form, twice with the same inputs: bitwise equal.
  Tensor x = random_tensor({64, 48}, 4), w = random_tensor({40, 48}, 5);
  Tensor y1 = Tensor::empty({64, 40}, DType::F32), y2 = Tensor::empty({64, 40}, DType::F32);
  matmul(x, w, y1, false, true);
  matmul(x, w, y2, false, true);
  EXPECT_EQ(y1.to_float_vector(), y2.to_float_vector());
  testing::expect_close(y1.to_float_vector(), ref_gemm(x, w, y1, false, true, 1.0, 0.0), 1e-5f, 1e-5f, "y");
}

TEST(Matmul, EmptyInnerDimensionScalesC) {
  Tensor a = Tensor::empty({3, 0}, DType::F32), b = Tensor::empty({0, 2}, DType::F32);
  Tensor c = Tensor::from_vector<float>({1, 2, 3, 4, 5, 6}, {3, 2});
  matmul(a, b, c, false, false, 1.0f, 0.5f);
  EXPECT_EQ(c.to_float_vector(), (std::vector<float>{0.5f, 1, 1.5f, 2, 2.5f, 3}));
}

TEST(Matmul, ErrorsNameTheTensor) {
  Tensor a = random_tensor({4, 3}, 1), b = random_tensor({3, 5}, 2);
  Tensor bad_c = Tensor::empty({4, 6}, DType::F32);
  testing::expect_error([&] { matmul(a, b, bad_c, false, false); }, "matmul: c");
  Tensor c = Tensor::empty({4, 5}, DType::F32);
  testing::expect_error([&] { matmul(a, b, c, true, false); }, "inner dimensions");
  Tensor b16 = b.to(DType::BF16);
  testing::expect_error([&] { matmul(a, b16, c, false, false); }, "BF16");
  Tensor a3 = Tensor::empty({2, 2, 3}, DType::F32);
  testing::expect_error([&] { matmul(a3, b, c, false, false); }, "2-D");
}

// matmul_grouped: each group's rows against a double-precision reference of its own weight; rows outside
// every group keep their values; an empty group's weight may be undefined. Tolerance: fp32 sums of K
// products of values below 1 err by at most K u sum|a b| (u = 2^-24); a row against the wrong expert's
// weight or a group off by one row is O(1) off.
TEST(MatmulGrouped, EveryGroupAgainstItsOwnWeight) {
  const int64_t K = 37, N = 19, P = 60;
  const std::vector<int64_t> offsets = {3, 10, 10, 41, 57};  // rows 0-2 and 57-59 in no group; group 1 empty
  const Tensor a = random_tensor({P, K}, 1);
  std::vector<Tensor> w = {random_tensor({N, K}, 2), Tensor(), random_tensor({N, K}, 3), random_tensor({N, K}, 4)};
  Tensor c = Tensor::from_vector(std::vector<float>(P * N, 7.0f), {P, N});
  matmul_grouped(a, w, offsets, c);
  const auto got = c.to_float_vector();
  for (size_t g = 0; g + 1 < offsets.size(); ++g) {
    if (offsets[g] == offsets[g + 1]) continue;
    const Tensor ag = a.slice(offsets[g], offsets[g + 1]);
    const Tensor c0 = Tensor::zeros({offsets[g + 1] - offsets[g], N}, DType::F32);
    const auto want = ref_gemm(ag, w[g], c0, false, true, 1.0, 0.0);
    for (size_t i = 0; i < want.size(); ++i)
      ASSERT_NEAR(got[offsets[g] * N + i], want[i], K * 6e-8) << "group " << g << " element " << i;
  }
  for (int64_t r : {0, 1, 2, 57, 58, 59})
    for (int64_t j = 0; j < N; ++j) ASSERT_EQ(got[r * N + j], 7.0f) << "row " << r << " is in no group";
  // BF16: the same fp32 sums, rounded once.
  Tensor cb = Tensor::zeros({P, N}, DType::BF16), cf = Tensor::zeros({P, N}, DType::F32);
  std::vector<Tensor> wb;
  for (const Tensor& t : w) wb.push_back(t.defined() ? t.to(DType::BF16) : Tensor());
  const Tensor ab = a.to(DType::BF16);
  matmul_grouped(ab, wb, offsets, cb);
  for (size_t g = 0; g + 1 < offsets.size(); ++g) {
    if (offsets[g] == offsets[g + 1]) continue;
    Tensor cg = cf.slice(offsets[g], offsets[g + 1]);
    matmul(ab.slice(offsets[g], offsets[g + 1]), wb[g], cg, false, true);
  }
  EXPECT_EQ(cb.to_float_vector(), cf.to(DType::BF16).to_float_vector());
}

TEST(MatmulGrouped, ErrorsNameTheGroup) {
  const Tensor a = random_tensor({8, 4}, 1);
  Tensor c = Tensor::zeros({8, 3}, DType::F32);
  auto fails_with = [&](const std::vector<Tensor>& w, const std::vector<int64_t>& off, const std::string& what) {
    try {
      matmul_grouped(a, w, off, c);
      ADD_FAILURE() << "no error, want one naming '" << what << "'";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  const Tensor w = random_tensor({3, 4}, 2);
  fails_with({w, random_tensor({3, 5}, 3)}, {0, 4, 8}, "group 1's weight is [3, 5], want [3, 4]");
  fails_with({w, Tensor()}, {0, 4, 8}, "group 1's weight is undefined");
  fails_with({w, w}, {0, 5, 4}, "group 1 has rows [5, 4)");
  fails_with({w, w}, {0, 4, 9}, "not within [0, 8)");
  fails_with({w, w}, {0, 8}, "2 offsets for 2 groups");
  fails_with({w, w.to(DType::BF16)}, {0, 4, 8}, "group 1's weight is BF16");
}

// matmul_grouped_quant on the CPU (the reference of the fused CUDA kernel): for every stored format
// and both dtypes, each group's rows against its own weight dequantized by kernels/quant.h: F32 within
// the fp32 bound K u sum |a w| (u = 2^-24; FP8 weights reach 44.8 here); BF16
// bitwise the GEMM of the bf16-rounded dequantized weight. Two parts per group (gate, up) of unequal
// rows; rows outside every group keep their values. A part in the wrong group's order, the wrong
// expert or an off-by-one part boundary is O(1) off.
Tensor abs_of(const Tensor& t) {
  std::vector<float> v = t.to_float_vector();
  for (float& x : v) x = std::fabs(x);
  return Tensor::from_vector(v, t.shape());
}

TEST(MatmulGroupedQuant, EveryFormatAgainstItsDequantizedWeight) {
  using F = GroupedWeightFormat;
  const int64_t K = 96, P = 50;
  const std::vector<int64_t> rows = {40, 24}, offsets = {2, 9, 9, 30, 47};
  const int64_t N = 64;
  for (F f : {F::Dense, F::Fp8Block, F::Int4Group})
    for (DType dt : {DType::F32, DType::BF16}) {
      SCOPED_TRACE(std::string(testing::format_name(f)) + " " + dtype_name(dt));
      std::vector<GroupedWeight> w;
      for (uint32_t g = 0; g < 4; ++g)
        w.push_back(g == 1 ? GroupedWeight{} : testing::random_grouped_weight(f, rows, K, 10 + g, dt));
      const Tensor a = random_tensor({P, K}, 5).to(dt);
      Tensor c = Tensor::from_vector(std::vector<float>(P * N, 7.0f), {P, N}).to(dt);
      matmul_grouped_quant(a, f, w, offsets, c);
      const auto got = c.to_float_vector();
      for (size_t g = 0; g + 1 < offsets.size(); ++g) {
        if (offsets[g] == offsets[g + 1]) continue;
        const Tensor wd = testing::dequantized(f, w[g], K, dt);
        const Tensor ag = a.slice(offsets[g], offsets[g + 1]);
        Tensor cg = Tensor::zeros({offsets[g + 1] - offsets[g], N}, dt);
        if (dt == DType::BF16) {
          matmul(ag, wd, cg, false, true);
          const auto want = cg.to_float_vector();
          for (size_t i = 0; i < want.size(); ++i)
            ASSERT_EQ(got[offsets[g] * N + i], want[i]) << "group " << g << " element " << i;
        } else {
          const auto want = ref_gemm(ag, wd, cg, false, true, 1.0, 0.0);
          const auto sum_abs = ref_gemm(abs_of(ag), abs_of(wd), cg, false, true, 1.0, 0.0);  // sum |a w|
          for (size_t i = 0; i < want.size(); ++i)
            ASSERT_NEAR(got[offsets[g] * N + i], want[i], K * 6e-8 * sum_abs[i]) << "group " << g << " element " << i;
        }
      }
      for (int64_t r : {0, 1, 47, 48, 49})
        for (int64_t j = 0; j < N; ++j) ASSERT_EQ(got[r * N + j], 7.0f) << "row " << r << " is in no group";
    }
}

TEST(MatmulGroupedQuant, ErrorsNameTheGroupAndPart) {
  using F = GroupedWeightFormat;
  const int64_t K = 64;
  const Tensor a = random_tensor({8, K}, 1).to(DType::BF16);
  Tensor c = Tensor::zeros({8, 48}, DType::BF16);
  const GroupedWeight ok = testing::random_grouped_weight(F::Int4Group, {32, 16}, K, 3);
  GroupedWeight bad_scale = ok;
  bad_scale[1].scale = Tensor::zeros({16, 3}, DType::BF16);
  testing::expect_error([&] { matmul_grouped_quant(a, F::Int4Group, {ok, bad_scale}, {0, 4, 8}, c); },
                        "group 1 part 1: weight_scale [16, 3]");
  testing::expect_error([&] { matmul_grouped_quant(a, F::Int4Group, {ok, {ok[0]}}, {0, 4, 8}, c); },
                        "group 1's parts have 32 rows, c has 48 columns");
  testing::expect_error([&] { matmul_grouped_quant(a, F::Fp8Block, {ok, ok}, {0, 4, 8}, c); },
                        "group 0 part 0: an FP8 weight");
  testing::expect_error([&] { matmul_grouped_quant(a, F::Int4Group, {ok, ok}, {0, 5, 4}, c); },
                        "group 1 has rows [5, 4)");
  const GroupedWeight dense = testing::random_grouped_weight(F::Dense, {48}, K, 4, DType::F32);
  testing::expect_error([&] { matmul_grouped_quant(a, F::Dense, {dense, dense}, {0, 4, 8}, c); },
                        "group 0 part 0: a Dense weight must be [rows, 64] BF16");
  // The CPU never takes the fused kernel, and says why.
  EXPECT_NE(grouped_quant_fused_unsupported(a, F::Int4Group, {ok, ok}, {0, 4, 8}, c), "");
}

}  // namespace
}  // namespace aerie
