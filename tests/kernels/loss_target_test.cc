// CPU target_distribution against a naive full-[T, V] double computation, against the steps of the
// former make_ttt_sample (bit-identical), its errors; the BF16 CPU paths of the loss family.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "kernel_test_util.h"
#include "kernels/gemm.h"
#include "kernels/loss.h"
#include "kernels/optim.h"

namespace aerie {
namespace {

using testing::random_tensor;

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

/// Naive reference: l = z W^T in double over all V, argmax over V (ties: smaller id), softmax of l[sel].
void naive_target(const std::vector<float>& z, const std::vector<float>& lm, const std::vector<int64_t>& sel,
                  int64_t t, int64_t h, int64_t v, std::vector<float>& probs, std::vector<int64_t>& am) {
  const int64_t k = static_cast<int64_t>(sel.size());
  probs.assign(static_cast<size_t>(t * k), 0.0f);
  am.assign(static_cast<size_t>(t), 0);
  std::vector<double> l(static_cast<size_t>(v));
  for (int64_t r = 0; r < t; ++r) {
    for (int64_t j = 0; j < v; ++j) {
      double s = 0.0;
      for (int64_t i = 0; i < h; ++i) s += static_cast<double>(z[r * h + i]) * lm[j * h + i];
      l[j] = s;
    }
    am[r] = std::max_element(l.begin(), l.end()) - l.begin();  // first maximum
    double mx = -1e300, sum = 0.0;
    for (int64_t s : sel) mx = std::max(mx, l[s]);
    for (int64_t s : sel) sum += std::exp(l[s] - mx);
    for (int64_t i = 0; i < k; ++i) probs[r * k + i] = static_cast<float>(std::exp(l[sel[i]] - mx) / sum);
  }
}

struct TargetCase {
  int64_t t, h, v, k, chunk;
  DType dtype;
};

TEST(TargetDistribution, MatchesNaiveFullVocabularyReference) {
  for (const TargetCase& c : {TargetCase{1, 64, 512, 100, 64, DType::F32}, TargetCase{130, 64, 512, 100, 7, DType::F32},
                              TargetCase{130, 64, 5000, 100, 1000, DType::F32}, TargetCase{70, 32, 300, 37, 64, DType::BF16},
                              TargetCase{9, 16, 200, 200, 1, DType::BF16}}) {
    SCOPED_TRACE("T=" + std::to_string(c.t) + " H=" + std::to_string(c.h) + " V=" + std::to_string(c.v) +
                 " chunk=" + std::to_string(c.chunk) + " " + dtype_name(c.dtype));
    Tensor z = random_tensor({c.t, c.h}, 11, -1.0f, 1.0f), lm = random_tensor({c.v, c.h}, 12, -1.0f, 1.0f);
    if (c.dtype == DType::BF16) {
      z = z.to(DType::BF16);
      lm = lm.to(DType::BF16);
    }
    const auto sel = random_selected(c.v, c.k, 13);
    Tensor probs = Tensor::empty({c.t, c.k}, DType::F32), am = Tensor::empty({c.t}, DType::I64);
    target_distribution(z, lm, Tensor::from_vector(sel, {c.k}), probs, am, c.chunk);
    std::vector<float> want_p;
    std::vector<int64_t> want_am;
    naive_target(z.to_float_vector(), lm.to_float_vector(), sel, c.t, c.h, c.v, want_p, want_am);
    // fp32 GEMM of H <= 64 O(1) terms: logits within ~1e-6, so probabilities within a few 1e-6 relative.
    testing::expect_close(probs.to_float_vector(), want_p, 1e-9f, 2e-5f, "target_probs");
    const int64_t* got_am = am.data<int64_t>();
    EXPECT_EQ(std::vector<int64_t>(got_am, got_am + c.t), want_am) << "target_argmax (random data: no near ties)";
  }
}

TEST(TargetDistribution, IntegerLogitsTieToTheSmallerId) {
  // Small integers: every logit is exact in fp32 whatever the summation order, so ties are exact.
  const int64_t t = 40, h = 8, v = 300, k = 50;
  std::mt19937 gen(5);
  std::uniform_int_distribution<int> d(-2, 2);
  Tensor z = Tensor::empty({t, h}, DType::F32), lm = Tensor::empty({v, h}, DType::F32);
  for (Tensor* x : {&z, &lm})
    for (int64_t i = 0; i < x->numel(); ++i) x->data<float>()[i] = static_cast<float>(d(gen));
  const auto sel = random_selected(v, k, 6);
  Tensor probs = Tensor::empty({t, k}, DType::F32), am = Tensor::empty({t}, DType::I64);
  target_distribution(z, lm, Tensor::from_vector(sel, {k}), probs, am, 16);
  std::vector<float> want_p;
  std::vector<int64_t> want_am;
  naive_target(z.to_float_vector(), lm.to_float_vector(), sel, t, h, v, want_p, want_am);
  const int64_t* got = am.data<int64_t>();
  EXPECT_EQ(std::vector<int64_t>(got, got + t), want_am);
  testing::expect_close(probs.to_float_vector(), want_p, 1e-9f, 1e-5f, "target_probs");
}

TEST(TargetDistribution, BitIdenticalToTheFormerMakeTttSampleSteps) {
  // The steps make_ttt_sample took before the op: widen, 64-row matmul chunks, argmax_rows, gather,
  // softmax_rows. make_ttt_sample now calls the op with row_chunk 64: its results must not move.
  const int64_t t = 150, h = 32, v = 700, k = 90;
  Tensor z = random_tensor({t, h}, 21).to(DType::BF16), lm = random_tensor({v, h}, 22);
  const auto sel = random_selected(v, k, 23);
  Tensor probs = Tensor::empty({t, k}, DType::F32), am = Tensor::empty({t}, DType::I64);
  target_distribution(z, lm, Tensor::from_vector(sel, {k}), probs, am, 64);

  Tensor zf = z.to(DType::F32), old_probs = Tensor::empty({t, k}, DType::F32);
  std::vector<int64_t> old_am(t);
  Tensor logits = Tensor::empty({64, v}, DType::F32);
  for (int64_t r0 = 0; r0 < t; r0 += 64) {
    const int64_t r1 = std::min(t, r0 + 64);
    Tensor l = logits.slice(0, r1 - r0);
    matmul(zf.slice(r0, r1), lm, l, false, true);
    const auto a = argmax_rows(l);
    for (int64_t r = r0; r < r1; ++r) {
      old_am[r] = a[r - r0];
      for (int64_t i = 0; i < k; ++i) old_probs.data<float>()[r * k + i] = l.data<float>()[(r - r0) * v + sel[i]];
    }
    Tensor q = old_probs.slice(r0, r1);
    softmax_rows(q, q);
  }
  EXPECT_EQ(probs.to_float_vector(), old_probs.to_float_vector());
  EXPECT_EQ(std::vector<int64_t>(am.data<int64_t>(), am.data<int64_t>() + t), old_am);
}

TEST(TargetDistribution, ErrorsNameTheProblem) {
  Tensor z = random_tensor({4, 8}, 1), lm = random_tensor({20, 8}, 2);
  Tensor probs = Tensor::empty({4, 3}, DType::F32), am = Tensor::empty({4}, DType::I64);
  auto sel = [](std::vector<int64_t> s) { return Tensor::from_vector(s, {static_cast<int64_t>(s.size())}); };
  target_distribution(z, lm, sel({0, 5, 19}), probs, am, 2);  // fine
  testing::expect_error([&] { target_distribution(z, lm, sel({0, 5, 20}), probs, am, 2); }, "selected ids");
  testing::expect_error([&] { target_distribution(z, lm, sel({5, 0, 7}), probs, am, 2); }, "selected ids");
  testing::expect_error([&] { target_distribution(z, lm, sel({0, 5, 7}), probs, am, 0); }, "row_chunk");
  Tensor lm_h = random_tensor({20, 9}, 2);
  testing::expect_error([&] { target_distribution(z, lm_h, sel({0, 5, 7}), probs, am, 2); }, "lm_head");
  Tensor probs4 = Tensor::empty({4, 4}, DType::F32);
  testing::expect_error([&] { target_distribution(z, lm, sel({0, 5, 7}), probs4, am, 2); }, "target_probs");
  Tensor am32 = Tensor::empty({4}, DType::I32);
  testing::expect_error([&] { target_distribution(z, lm, sel({0, 5, 7}), probs, am32, 2); }, "target_argmax");
  Tensor sel32 = Tensor::from_vector<int32_t>({0, 5, 7}, {3});
  testing::expect_error([&] { target_distribution(z, lm, sel32, probs, am, 2); }, "selected");
}

TEST(LossBf16Cpu, SoftCrossEntropyWidensAndRoundsDlogits) {
  const int64_t n = 5, k = 33;
  Tensor z = random_tensor({n, k}, 31, -4.0f, 4.0f).to(DType::BF16), q = random_tensor({n, k}, 32, 0.0f, 1.0f);
  float* qp = q.data<float>();
  for (int64_t r = 0; r < n; ++r) {
    double s = 0.0;
    for (int64_t i = 0; i < k; ++i) s += qp[r * k + i];
    for (int64_t i = 0; i < k; ++i) qp[r * k + i] = static_cast<float>(qp[r * k + i] / s);
  }
  Tensor w = Tensor::from_vector<float>({1.0f, 0.0f, 2.0f, 0.5f, 1.0f}, {n});
  Tensor zf = z.to(DType::F32), dref = Tensor::empty({n, k}, DType::F32), dz = Tensor::empty({n, k}, DType::BF16);
  const double ref = soft_cross_entropy(zf, q, w, &dref);
  EXPECT_EQ(soft_cross_entropy(z, q, w, &dz), ref);
  EXPECT_EQ(dz.to_float_vector(), dref.to(DType::BF16).to_float_vector());
  // In place: dlogits may be the logits tensor itself.
  Tensor zi = zf.clone();
  EXPECT_EQ(soft_cross_entropy(zi, q, w, &zi), ref);
  EXPECT_EQ(zi.to_float_vector(), dref.to_float_vector());
  // dlogits in another dtype than the logits: F32 from BF16 logits is the fp32 gradient itself.
  Tensor df = Tensor::empty({n, k}, DType::F32);
  EXPECT_EQ(soft_cross_entropy(z, q, w, &df), ref);
  EXPECT_EQ(df.to_float_vector(), dref.to_float_vector());
  Tensor zf2 = zf.clone();
  Tensor zf2_as_bf16 = Tensor::wrap(zf2.raw(), {n, k}, DType::BF16);  // the same bytes, another dtype
  testing::expect_error([&] { soft_cross_entropy(zf2, q, w, &zf2_as_bf16); }, "in place only in the same dtype");
}

// The TTT step's form (draft_ttt.cc): the loss, the argmaxes and the gradient scaled by the step weight and
// rounded to the GEMM dtype, from one call, equal to the separate steps it replaces (soft_cross_entropy,
// argmax_rows, scale_inplace, convert). Weight-0 rows keep their argmax.
TEST(SoftCrossEntropy, FusedHeadEqualsTheSeparateSteps) {
  const int64_t n = 6, k = 41;
  for (DType zt : {DType::F32, DType::BF16})
    for (DType dt : {DType::F32, DType::BF16}) {
      SCOPED_TRACE(std::string("logits ") + dtype_name(zt) + ", dlogits " + dtype_name(dt));
      Tensor z = random_tensor({n, k}, 51, -4.0f, 4.0f).to(zt), q = random_tensor({n, k}, 52, 0.0f, 1.0f);
      float* qp = q.data<float>();
      for (int64_t r = 0; r < n; ++r) {
        double s = 0.0;
        for (int64_t i = 0; i < k; ++i) s += qp[r * k + i];
        for (int64_t i = 0; i < k; ++i) qp[r * k + i] = static_cast<float>(qp[r * k + i] / s);
      }
      Tensor w = Tensor::from_vector<float>({1.0f, 0.0f, 2.0f, 0.5f, 1.0f, 0.0f}, {n});
      Tensor dref = Tensor::empty({n, k}, zt);
      const double ref = soft_cross_entropy(z, q, w, &dref);
      Tensor dref32 = dref.to(DType::F32);
      scale_inplace(dref32, 0.64f);
      const std::vector<int64_t> am_ref = argmax_rows(z);
      Tensor d = Tensor::empty({n, k}, dt);
      std::vector<int64_t> am;
      EXPECT_EQ(soft_cross_entropy(z, q, w, &d, 0.64f, &am), ref);
      EXPECT_EQ(am, am_ref);
      if (zt == DType::F32) {  // the separate steps' F32 gradient, scaled, rounded once
        EXPECT_EQ(d.to_float_vector(), dref32.to(dt).to_float_vector());
      } else {  // BF16 logits: the separate steps rounded the gradient to bf16 before the scale; the fused
                // one rounds once, after it: equal to the fp32 gradient scaled and rounded
        Tensor d32 = Tensor::empty({n, k}, DType::F32);
        soft_cross_entropy(z, q, w, &d32);
        scale_inplace(d32, 0.64f);
        EXPECT_EQ(d.to_float_vector(), d32.to(dt).to_float_vector());
      }
      std::vector<int64_t> am0;
      soft_cross_entropy(z, q, w, nullptr, 1.0f, &am0);
      EXPECT_EQ(am0, am_ref) << "argmax without dlogits";
    }
}

TEST(LossBf16Cpu, SoftmaxAndArgmaxAcceptBf16) {
  Tensor x = random_tensor({3, 17}, 41, -3.0f, 3.0f).to(DType::BF16);
  Tensor y = Tensor::empty({3, 17}, DType::BF16), yf = x.to(DType::F32);
  softmax_rows(x, y);
  softmax_rows(yf, yf);
  EXPECT_EQ(y.to_float_vector(), yf.to(DType::BF16).to_float_vector());
  EXPECT_EQ(argmax_rows(x), argmax_rows(x.to(DType::F32)));
  Tensor yw = Tensor::empty({3, 17}, DType::F32);
  testing::expect_error([&] { softmax_rows(x, yw); }, "softmax_rows: y");
}

}  // namespace
}  // namespace aerie
