// The CUDA loss family (soft_cross_entropy, softmax_rows, argmax_rows, target_distribution) against the
// CPU reference on the same inputs (BF16 cases: the CPU is fed the same bf16-rounded values, widened).
// Every test skips without a GPU.
#include <algorithm>
#include <cmath>
#include <functional>
#include <numeric>
#include <random>
#include <string>

#include "kernel_test_util.h"
#include "kernels/loss.h"
#include "kernels/optim.h"

namespace aerie {
namespace {

using testing::random_tensor;

Tensor gpu(const Tensor& t) { return t.to_device(Device::CUDA); }

/// Random target rows summing to 1, every 7th entry exactly 0.
Tensor random_target(int64_t n, int64_t k, uint32_t seed) {
  Tensor t = random_tensor({n, k}, seed, 0.0f, 1.0f);
  float* p = t.data<float>();
  for (int64_t r = 0; r < n; ++r) {
    double s = 0.0;
    for (int64_t i = 0; i < k; ++i) {
      if ((r + i) % 7 == 0) p[r * k + i] = 0.0f;
      s += p[r * k + i];
    }
    for (int64_t i = 0; i < k; ++i) p[r * k + i] = static_cast<float>(p[r * k + i] / s);
  }
  return t;
}

/// Row weights with zeros (every third row from row 1) and values other than 1.
Tensor row_weights(int64_t n) {
  std::vector<float> w(static_cast<size_t>(n));
  for (int64_t r = 0; r < n; ++r) w[r] = r % 3 == 1 ? 0.0f : 0.5f + static_cast<float>(r % 4);
  return Tensor::from_vector(w, {n});
}

/// x in dtype dt (a CPU tensor): the values the GPU gets; as_ref: the fp32 values the CPU reference gets.
Tensor in_dtype(const Tensor& x, DType dt) { return dt == DType::F32 ? x : x.to(DType::BF16); }
Tensor as_ref(const Tensor& x) { return x.dtype() == DType::F32 ? x : x.to(DType::F32); }

std::string label(int64_t n, int64_t k, DType dt) {
  return "N=" + std::to_string(n) + " K=" + std::to_string(k) + " " + dtype_name(dt);
}

/// dlogits = w (p - q). The GPU's p differs from the CPU's by a few 1e-6 relative (fp32 expf, 2 ulp, of
/// an argument rounded to fp32, |arg| < 30), so the bound is 5e-6 w p plus 2 fp32 ulps of the result
/// (p - q and the product are rounded on both sides) plus, for BF16 output, the rounding to bf16
/// (half an ulp = 2^-9 relative; out_rel = 4e-3 leaves a margin). Rows of weight 0 must be exactly 0.
void expect_dlogits_close(const std::vector<float>& got, const std::vector<float>& ref, const std::vector<float>& q,
                          const std::vector<float>& w, int64_t k, double out_rel) {
  ASSERT_EQ(got.size(), ref.size());
  int bad = 0;
  for (size_t e = 0; e < got.size(); ++e) {
    const float wr = w[e / static_cast<size_t>(k)];
    double tol = 0.0;
    if (wr != 0.0f) {
      const double p = std::fabs(static_cast<double>(ref[e]) / wr + q[e]);
      tol = 5e-6 * wr * p + (2.5e-7 + out_rel) * std::fabs(ref[e]) + 1e-30;
    }
    if (!(std::fabs(static_cast<double>(got[e]) - ref[e]) <= tol) && ++bad <= 5)
      ADD_FAILURE() << "dlogits[" << e << "]: got " << got[e] << ", want " << ref[e] << " (tol " << tol << ")";
  }
  EXPECT_EQ(bad, 0);
}

TEST(LossCuda, SoftCrossEntropyMatchesCpu) {
  AERIE_REQUIRE_CUDA();
  uint32_t seed = 100;
  for (int64_t n : {1, 7, 300})
    for (int64_t k : {5, 1000, 32000})
      for (DType dt : {DType::F32, DType::BF16}) {
        SCOPED_TRACE(label(n, k, dt));
        const Tensor z = in_dtype(random_tensor({n, k}, ++seed, -8.0f, 8.0f), dt), q = random_target(n, k, ++seed);
        const Tensor w = row_weights(n);
        Tensor dref = Tensor::empty({n, k}, DType::F32);
        const double ref = soft_cross_entropy(as_ref(z), q, w, &dref);
        const Tensor zg = gpu(z), qg = gpu(q), wg = gpu(w);
        Tensor dg = Tensor::empty({n, k}, dt, Device::CUDA);
        const double got = soft_cross_entropy(zg, qg, wg, &dg);
        // Per row the GPU's log-sum-exp is within ~1e-6 of the double one (fp32 exp of each element,
        // double sums and rescales), so |CE_n error| <= ~1e-6 sum_i q_i = 1e-6; 3e-6 per unit weight.
        double wsum = 0.0;
        for (float x : w.to_float_vector()) wsum += x;
        EXPECT_NEAR(got, ref, 3e-6 * wsum + 1e-12 * std::fabs(ref));
        expect_dlogits_close(dg.to_float_vector(), dref.to_float_vector(), q.to_float_vector(), w.to_float_vector(), k,
                             dt == DType::BF16 ? 4e-3 : 0.0);
        EXPECT_EQ(soft_cross_entropy(zg, qg, wg, nullptr), got) << "deterministic, with or without dlogits";
        Tensor zi = gpu(z);  // in place: dlogits = logits
        EXPECT_EQ(soft_cross_entropy(zi, qg, wg, &zi), got);
        EXPECT_EQ(zi.to_float_vector(), dg.to_float_vector()) << "in-place dlogits";
      }
}

// The TTT step's fused form on the GPU: the argmaxes equal argmax_rows' (GPU and CPU), the loss equals the
// plain call's bit for bit, and dlogits in the other dtype, scaled, equals the plain call's F32 gradient
// scaled and rounded once (the same fp32 operations in the same kernel). Rows of weight 0 (row_weights
// has some) keep their argmax.
TEST(LossCuda, SoftCrossEntropyFusedHeadEqualsTheSeparateSteps) {
  AERIE_REQUIRE_CUDA();
  uint32_t seed = 150;
  for (int64_t n : {1, 7, 300})
    for (int64_t k : {5, 1000, 32000})
      for (DType zt : {DType::F32, DType::BF16})
        for (DType dt : {DType::F32, DType::BF16}) {
          SCOPED_TRACE(label(n, k, zt) + " dlogits " + dtype_name(dt));
          const Tensor z = in_dtype(random_tensor({n, k}, ++seed, -8.0f, 8.0f), zt), q = random_target(n, k, ++seed);
          const Tensor zg = gpu(z), qg = gpu(q), wg = gpu(row_weights(n));
          Tensor d32 = Tensor::empty({n, k}, DType::F32, Device::CUDA);
          const double plain = soft_cross_entropy(zg, qg, wg, &d32);
          scale_inplace(d32, 0.8f);
          Tensor d = Tensor::empty({n, k}, dt, Device::CUDA);
          std::vector<int64_t> am;
          EXPECT_EQ(soft_cross_entropy(zg, qg, wg, &d, 0.8f, &am), plain);
          EXPECT_EQ(am, argmax_rows(zg));
          EXPECT_EQ(am, argmax_rows(as_ref(z))) << "against the CPU";
          EXPECT_EQ(d.to_float_vector(), d32.to_device(Device::CPU).to(dt).to_float_vector());
        }
}

TEST(LossCuda, SoftmaxRowsMatchesCpu) {
  AERIE_REQUIRE_CUDA();
  uint32_t seed = 200;
  for (int64_t n : {1, 7, 300})
    for (int64_t k : {5, 1000, 32000})
      for (DType dt : {DType::F32, DType::BF16}) {
        SCOPED_TRACE(label(n, k, dt));
        const Tensor x = in_dtype(random_tensor({n, k}, ++seed, -8.0f, 8.0f), dt);
        Tensor yref = as_ref(x).clone();
        softmax_rows(yref, yref);
        Tensor xg = gpu(x), yg = Tensor::empty({n, k}, dt, Device::CUDA);
        softmax_rows(xg, yg);
        // The CPU sums the K exponentials sequentially in fp32 (relative error ~ sqrt(K) 6e-8 ~ 1e-5 at
        // K = 32000), the GPU in a tree; 5e-5 relative covers both. BF16: plus the output rounding (2^-9).
        const float rtol = dt == DType::BF16 ? 4e-3f : 5e-5f;
        testing::expect_close(yg.to_float_vector(), yref.to_float_vector(), 1e-30f, rtol, "softmax");
        softmax_rows(xg, xg);  // in place
        EXPECT_EQ(xg.to_float_vector(), yg.to_float_vector()) << "in place";
      }
}

TEST(LossCuda, ArgmaxRowsMatchesCpuWithTies) {
  AERIE_REQUIRE_CUDA();
  std::mt19937 gen(7);
  std::uniform_int_distribution<int> d(0, 9);  // integers: exact in bf16, many ties per row
  for (int64_t n : {1, 7, 300})
    for (int64_t k : {5, 1000, 32000})
      for (DType dt : {DType::F32, DType::BF16}) {
        SCOPED_TRACE(label(n, k, dt));
        Tensor x = Tensor::empty({n, k}, DType::F32);
        float* p = x.data<float>();
        for (int64_t i = 0; i < n * k; ++i) p[i] = static_cast<float>(d(gen));
        if (n > 1)
          for (int64_t i = 0; i < k; ++i) p[k + i] = -INFINITY;  // an all -inf row: index 0
        if (n > 2) p[2 * k + k - 1] = 50.0f;                     // the last element wins
        const Tensor xd = in_dtype(x, dt);
        const auto want = argmax_rows(xd);
        EXPECT_EQ(argmax_rows(gpu(xd)), want);
        if (n > 1) {
          EXPECT_EQ(want[1], 0);
        }
      }
}

/// K distinct ascending ids of [0, V), seeded.
std::vector<int64_t> random_selected(int64_t v, int64_t k, uint32_t seed) {
  std::vector<int64_t> ids(static_cast<size_t>(v));
  std::iota(ids.begin(), ids.end(), 0);
  std::mt19937 gen(seed);
  std::shuffle(ids.begin(), ids.end(), gen);
  ids.resize(static_cast<size_t>(k));
  std::sort(ids.begin(), ids.end());
  return ids;
}

struct TargetCase {
  int64_t t, h, v, k, chunk;
  DType z_dtype, lm_dtype;
  bool integers;  // small integer inputs: every logit exact in fp32, exact ties
};

std::string label(const TargetCase& c) {
  return "T=" + std::to_string(c.t) + " H=" + std::to_string(c.h) + " V=" + std::to_string(c.v) +
         " chunk=" + std::to_string(c.chunk) + " z " + dtype_name(c.z_dtype) + " lm " + dtype_name(c.lm_dtype) +
         (c.integers ? " integers" : "");
}

TEST(LossCuda, TargetDistributionMatchesCpu) {
  AERIE_REQUIRE_CUDA();
  using D = DType;
  uint32_t seed = 300;
  for (const TargetCase& c : {TargetCase{1, 64, 512, 100, 64, D::F32, D::F32, false},
                              TargetCase{130, 64, 512, 100, 7, D::F32, D::F32, false},
                              TargetCase{130, 256, 5000, 100, 200, D::F32, D::F32, false},
                              TargetCase{130, 256, 5000, 100, 64, D::BF16, D::BF16, false},
                              TargetCase{1, 256, 5000, 100, 1, D::BF16, D::BF16, false},
                              TargetCase{130, 64, 512, 100, 300, D::BF16, D::F32, false},   // z widened
                              TargetCase{130, 64, 5000, 100, 50, D::F32, D::BF16, false},   // z rounded to bf16
                              TargetCase{130, 64, 5000, 100, 50, D::F32, D::F32, true},
                              TargetCase{130, 64, 5000, 100, 200, D::BF16, D::BF16, true},
                              // V % 4 != 0: the kernel's scalar loads instead of 16-byte ones
                              TargetCase{130, 64, 5001, 100, 64, D::F32, D::F32, false},
                              TargetCase{130, 64, 5003, 100, 64, D::BF16, D::BF16, true}}) {
    SCOPED_TRACE(label(c));
    Tensor zf = random_tensor({c.t, c.h}, ++seed), lmf = random_tensor({c.v, c.h}, ++seed);
    if (c.integers)
      for (Tensor* x : {&zf, &lmf})
        for (int64_t i = 0; i < x->numel(); ++i) x->data<float>()[i] = std::round(2.0f * x->data<float>()[i]);
    const Tensor z = in_dtype(zf, c.z_dtype), lm = in_dtype(lmf, c.lm_dtype);
    // The GPU runs the GEMM in lm_head's dtype: a F32 z with a BF16 lm_head is rounded to bf16 first.
    const Tensor z_ref = c.lm_dtype == D::BF16 ? in_dtype(zf, D::BF16) : z;
    const auto sel_v = random_selected(c.v, c.k, ++seed);
    const Tensor sel = Tensor::from_vector(sel_v, {c.k});
    Tensor p_ref = Tensor::empty({c.t, c.k}, D::F32), am_ref = Tensor::empty({c.t}, D::I64);
    target_distribution(z_ref, lm, sel, p_ref, am_ref, c.chunk);
    Tensor p_g = Tensor::empty({c.t, c.k}, D::F32, Device::CUDA), am_g = Tensor::empty({c.t}, D::I64, Device::CUDA);
    target_distribution(gpu(z), gpu(lm), gpu(sel), p_g, am_g, c.chunk);

    // Both GEMMs accumulate in fp32 (no TF32) in different orders. For H = 256 terms of size <= 1 the
    // partial sums reach ~5 (ulp 5e-7): each order's rounding error has std ~ sqrt(H) ulp / sqrt(12)
    // ~ 2e-6, so over 13,000 logits the two differ by up to ~1.5e-5, and a probability (relative error
    // = delta_i - sum_j p_j delta_j) by up to ~3e-5: 2e-4 leaves a margin; a wrong id or sum is O(1).
    // Integer inputs: identical logits, only the softmax sums differ (1e-5).
    testing::expect_close(p_g.to_float_vector(), p_ref.to_float_vector(), 1e-30f, c.integers ? 1e-5f : 2e-4f,
                          "target_probs");
    const Tensor am_gh = am_g.to_device(Device::CPU);
    const int64_t* got = am_gh.data<int64_t>();
    const int64_t* want = am_ref.data<int64_t>();
    if (c.integers) {
      EXPECT_EQ(std::vector<int64_t>(got, got + c.t), std::vector<int64_t>(want, want + c.t)) << "exact ties";
      continue;
    }
    // Random inputs: exact argmax unless the top two logits (double reference) are within 1e-3, where
    // either of the near-tied ids is right; such rows are rare (checked).
    const auto zv = as_ref(z_ref).to_float_vector(), lv = as_ref(lm).to_float_vector();
    int near_ties = 0;
    for (int64_t r = 0; r < c.t; ++r) {
      std::vector<double> l(static_cast<size_t>(c.v));
      for (int64_t j = 0; j < c.v; ++j)
        for (int64_t i = 0; i < c.h; ++i) l[j] += static_cast<double>(zv[r * c.h + i]) * lv[j * c.h + i];
      std::vector<double> top(l);
      std::partial_sort(top.begin(), top.begin() + 2, top.end(), std::greater<double>());
      ASSERT_TRUE(got[r] >= 0 && got[r] < c.v) << "row " << r;
      if (top[0] - top[1] > 1e-3) {
        EXPECT_EQ(got[r], want[r]) << "row " << r;
        EXPECT_EQ(l[want[r]], top[0]) << "row " << r;
      } else {
        ++near_ties;
        EXPECT_GE(l[got[r]], top[0] - 1e-3) << "row " << r;
      }
    }
    EXPECT_LE(near_ties, c.t / 10 + 1);
  }
}

TEST(LossCuda, TargetDistributionRejectsSelectedIdsOutsideTheVocabulary) {
  AERIE_REQUIRE_CUDA();
  const Tensor z = gpu(random_tensor({5, 8}, 1)), lm = gpu(random_tensor({20, 8}, 2));
  const Tensor sel = gpu(Tensor::from_vector<int64_t>({0, 3, 20}, {3}));
  Tensor p = Tensor::empty({5, 3}, DType::F32, Device::CUDA), am = Tensor::empty({5}, DType::I64, Device::CUDA);
  testing::expect_error([&] { target_distribution(z, lm, sel, p, am, 2); }, "outside [0, 20)");
  const Tensor unsorted = gpu(Tensor::from_vector<int64_t>({0, 7, 3}, {3}));
  testing::expect_error([&] { target_distribution(z, lm, unsorted, p, am, 2); }, "must ascend");
  const Tensor twice = gpu(Tensor::from_vector<int64_t>({0, 3, 3}, {3}));
  testing::expect_error([&] { target_distribution(z, lm, twice, p, am, 2); }, "must ascend");
}

}  // namespace
}  // namespace aerie
