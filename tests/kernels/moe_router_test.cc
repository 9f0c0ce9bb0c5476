// MoE router (kernels/moe_router.h) on the CPU against transformers' DeepseekV3TopkRouter
// (tools/reference/quant_router_golden.py: E 16, n_group 4, topk_group 2, top-k 4; random rows and
// constructed exact ties, a near tie at the cut, tied groups, a masked best expert, all-equal logits; a
// negative bias, and norm_topk_prob off). Indices exactly; weights to 2 ulp (HF sums the k weights in
// another order). The softmax top-k router (Qwen3-MoE, Mixtral) against transformers' own routers
// (tools/reference/softmax_router_golden.py). The expert sort: counts, offsets and the stable permutation; the error messages.
#include "kernel_test_util.h"
#include "kernels/embedding.h"
#include "kernels/moe_router.h"
#include "quant_fixture.h"

namespace aerie {
namespace {

using testing::expect_error;
using testing::golden;

MoeRouterConfig config_of(const std::string& c) {
  const int32_t* f = golden("router." + c + ".config").data<int32_t>();
  MoeRouterConfig cfg;
  cfg.n_group = f[1];
  cfg.topk_group = f[2];
  cfg.top_k = f[3];
  cfg.norm_topk_prob = f[4] != 0;
  cfg.routed_scaling_factor = golden("router." + c + ".routed_scaling_factor").data<float>()[0];
  return cfg;
}

std::vector<int32_t> row(const Tensor& t, int64_t r) {
  const int64_t k = t.dim(1);
  return std::vector<int32_t>(t.data<int32_t>() + r * k, t.data<int32_t>() + (r + 1) * k);
}

TEST(MoeRouter, MatchesTransformersDeepseekV3TopkRouter) {
  for (const std::string c : {"random", "negative_bias", "no_norm"}) {
    const Tensor& logits = golden("router." + c + ".logits");
    const MoeRouterConfig cfg = config_of(c);
    const int64_t t = logits.dim(0), k = cfg.top_k;
    Tensor idx = Tensor::empty({t, k}, DType::I32), w = Tensor::empty({t, k}, DType::F32);
    moe_router_noaux_tc(logits, golden("router." + c + ".bias"), cfg, idx, w);
    const Tensor& hf = golden("router." + c + ".hf_indices");
    const Tensor& rule = golden("router." + c + ".rule_indices");
    const uint8_t* tie = golden("router." + c + ".tie_at_cut").data<uint8_t>();
    const float* hw = golden("router." + c + ".hf_weights").data<float>();
    int ties = 0, hf_differs = 0;
    for (int64_t r = 0; r < t; ++r) {
      const std::string what = c + " row " + std::to_string(r);
      // Every row: aerie's documented rule (choice descending, then the lower index).
      EXPECT_EQ(row(idx, r), row(rule, r)) << what;
      if (tie[r]) {  // an exact tie at the cut: torch.topk keeps an arbitrary member
        ++ties;
        hf_differs += row(hf, r) != row(rule, r);
        continue;
      }
      EXPECT_EQ(row(idx, r), row(hf, r)) << what;
      for (int64_t i = 0; i < k; ++i) {
        const float ref = hw[r * k + i], got = w.data<float>()[r * k + i];
        EXPECT_NEAR(got, ref, 2.5e-7f * std::fabs(ref)) << what << " slot " << i;
      }
    }
    EXPECT_GE(ties, 1) << c << ": the fixture's constructed ties";
    if (c == "no_norm") {
      EXPECT_GE(hf_differs, 1) << "the fixture shows torch.topk keeping the higher index once";
    }
  }
}

TEST(MoeRouter, WeightsAreUnbiasedScoresNormalizedAndScaled) {
  // One token, 4 experts in 2 groups, keep 1 group, top 2. The bias moves group 1 ahead although its
  // scores are lower; the weights use the unbiased scores.
  Tensor logits = Tensor::from_vector<float>({2.0f, 1.0f, 0.0f, -0.5f}, {1, 4});
  Tensor bias = Tensor::from_vector<float>({0.0f, 0.0f, 1.0f, 1.0f}, {4});
  MoeRouterConfig cfg{2, 1, 2, true, 2.5f};
  Tensor idx = Tensor::empty({1, 2}, DType::I32), w = Tensor::empty({1, 2}, DType::F32);
  moe_router_noaux_tc(logits, bias, cfg, idx, w);
  EXPECT_EQ(row(idx, 0), (std::vector<int32_t>{2, 3}));
  const float s2 = 0.5f, s3 = 1.0f / (1.0f + std::exp(0.5f));
  EXPECT_FLOAT_EQ(w.data<float>()[0], s2 / (s2 + s3) * 2.5f);
  EXPECT_FLOAT_EQ(w.data<float>()[1], s3 / (s2 + s3) * 2.5f);
  cfg.norm_topk_prob = false;
  moe_router_noaux_tc(logits, bias, cfg, idx, w);
  EXPECT_FLOAT_EQ(w.data<float>()[0], s2 * 2.5f);
}

TEST(MoeRouter, RejectsBadConfigsAndShapes) {
  Tensor logits = Tensor::zeros({3, 16}, DType::F32), bias = Tensor::zeros({16}, DType::F32);
  Tensor idx = Tensor::empty({3, 4}, DType::I32), w = Tensor::empty({3, 4}, DType::F32);
  expect_error([&] { moe_router_noaux_tc(logits, bias, {3, 1, 4, true, 1.0f}, idx, w); }, "n_group 3");
  expect_error([&] { moe_router_noaux_tc(logits, bias, {4, 5, 4, true, 1.0f}, idx, w); }, "topk_group 5");
  Tensor idx9 = Tensor::empty({3, 9}, DType::I32), w9 = Tensor::empty({3, 9}, DType::F32);
  expect_error([&] { moe_router_noaux_tc(logits, bias, {4, 2, 9, true, 1.0f}, idx9, w9); }, "top_k 9");
  expect_error([&] { moe_router_noaux_tc(logits, Tensor::zeros({15}, DType::F32), {4, 2, 4, true, 1.0f}, idx, w); },
               "e_score_correction_bias");
  expect_error([&] { moe_router_noaux_tc(logits.to(DType::BF16), bias, {4, 2, 4, true, 1.0f}, idx, w); }, "logits");
  expect_error([&] { moe_router_noaux_tc(logits, bias, {4, 2, 4, true, 1.0f}, w, w); }, "indices");
}

/// The softmax router's config of a golden case (tools/reference/softmax_router_golden.py).
MoeRouterConfig softmax_config(const std::string& c) {
  MoeRouterConfig cfg;
  cfg.top_k = testing::softmax_router_golden(c + ".indices").dim(1);
  cfg.norm_topk_prob = c != "qwen3_nonorm";
  return cfg;
}

TEST(MoeRouterSoftmax, MatchesTransformersQwen3MoeAndMixtralRouters) {
  // Random rows and near ties (4e-6 apart in the logits) at and inside the cut; indices exactly (the
  // golden's are torch.topk's, probabilities descending), weights to 2 ulp (HF's softmax sums in another order).
  for (const std::string c : {"qwen3", "qwen3_nonorm", "mixtral"}) {
    const Tensor& logits = testing::softmax_router_golden(c + ".logits");
    const MoeRouterConfig cfg = softmax_config(c);
    const int64_t t = logits.dim(0), k = cfg.top_k;
    Tensor idx = Tensor::empty({t, k}, DType::I32), w = Tensor::empty({t, k}, DType::F32);
    moe_router_softmax_topk(logits, cfg, idx, w);
    const Tensor& hf = testing::softmax_router_golden(c + ".indices");
    const float* hw = testing::softmax_router_golden(c + ".weights").data<float>();
    for (int64_t r = 0; r < t; ++r) {
      const std::string what = c + " row " + std::to_string(r);
      EXPECT_EQ(row(idx, r), row(hf, r)) << what;
      for (int64_t i = 0; i < k; ++i)
        EXPECT_NEAR(w.data<float>()[r * k + i], hw[r * k + i], 2.5e-7f * std::fabs(hw[r * k + i])) << what;
    }
  }
}

TEST(MoeRouterSoftmax, WeightsAreTheProbabilitiesRenormalizedOrNot) {
  // p = softmax(2, 1, 0, -1); top 2 = experts 0, 1. Renormalized: p0 / (p0 + p1); not: p0. moe_router picks by kind.
  Tensor logits = Tensor::from_vector<float>({1.0f, 2.0f, -1.0f, 0.0f}, {1, 4});
  MoeRouterConfig cfg;
  cfg.top_k = 2;
  Tensor idx = Tensor::empty({1, 2}, DType::I32), w = Tensor::empty({1, 2}, DType::F32);
  moe_router(MoeRouterKind::SoftmaxTopK, logits, Tensor(), cfg, idx, w);
  EXPECT_EQ(row(idx, 0), (std::vector<int32_t>{1, 0}));
  const double z = std::exp(1.0) + std::exp(2.0) + std::exp(-1.0) + 1.0;
  EXPECT_NEAR(w.data<float>()[0], std::exp(2.0) / (std::exp(2.0) + std::exp(1.0)), 1e-6);
  cfg.norm_topk_prob = false;
  moe_router(MoeRouterKind::SoftmaxTopK, logits, Tensor(), cfg, idx, w);
  EXPECT_NEAR(w.data<float>()[0], std::exp(2.0) / z, 1e-6);
  EXPECT_NEAR(w.data<float>()[1], std::exp(1.0) / z, 1e-6);
}

TEST(MoeRouterSoftmax, RejectsGroupsAndBadTopK) {
  Tensor logits = Tensor::zeros({3, 8}, DType::F32);
  Tensor idx = Tensor::empty({3, 2}, DType::I32), w = Tensor::empty({3, 2}, DType::F32);
  expect_error([&] { moe_router_softmax_topk(logits, {2, 1, 2, true, 1.0f}, idx, w); }, "no expert groups");
  Tensor idx9 = Tensor::empty({3, 9}, DType::I32), w9 = Tensor::empty({3, 9}, DType::F32);
  expect_error([&] { moe_router_softmax_topk(logits, {1, 1, 9, true, 1.0f}, idx9, w9); }, "top_k 9");
  expect_error([&] { moe_router_softmax_topk(logits, {1, 1, 2, true, 1.0f}, w, w); }, "indices");
}

TEST(MoeSort, CountsOffsetsAndStablePermutation) {
  // T = 4 tokens, k = 2; experts 0..3 (expert 1 gets no pair).
  Tensor idx = Tensor::from_vector<int32_t>({2, 0, 0, 3, 2, 3, 0, 2}, {4, 2});
  Tensor counts = Tensor::empty({4}, DType::I32), offsets = Tensor::empty({5}, DType::I32);
  Tensor perm = Tensor::empty({8}, DType::I32);
  moe_sort_by_expert(idx, 4, counts, offsets, perm);
  EXPECT_EQ(row(counts.reshape({1, 4}), 0), (std::vector<int32_t>{3, 0, 3, 2}));
  EXPECT_EQ(row(offsets.reshape({1, 5}), 0), (std::vector<int32_t>{0, 3, 3, 6, 8}));
  EXPECT_EQ(row(perm.reshape({1, 8}), 0), (std::vector<int32_t>{1, 2, 6, 0, 4, 7, 3, 5}));
  // An index out of range names itself.
  Tensor bad = Tensor::from_vector<int32_t>({0, 4}, {1, 2});
  Tensor p2 = Tensor::empty({2}, DType::I32);
  expect_error([&] { moe_sort_by_expert(bad, 4, counts, offsets, p2); }, "indices[1] = 4");
  expect_error([&] { moe_sort_by_expert(idx, 4, counts, offsets, p2); }, "perm");
  expect_error([&] { moe_sort_by_expert(idx, 3, counts, offsets, perm); }, "counts");
}

TEST(MoeSort, RouterOutputRoundTrips) {
  const Tensor& logits = golden("router.random.logits");
  const MoeRouterConfig cfg = config_of("random");
  const int64_t t = logits.dim(0), k = cfg.top_k, e = logits.dim(1);
  Tensor idx = Tensor::empty({t, k}, DType::I32), w = Tensor::empty({t, k}, DType::F32);
  moe_router_noaux_tc(logits, golden("router.random.bias"), cfg, idx, w);
  Tensor counts = Tensor::empty({e}, DType::I32), offsets = Tensor::empty({e + 1}, DType::I32);
  Tensor perm = Tensor::empty({t * k}, DType::I32);
  moe_sort_by_expert(idx, e, counts, offsets, perm);
  std::vector<int> seen(static_cast<size_t>(t * k), 0);
  for (int64_t x = 0; x < e; ++x)
    for (int32_t j = offsets.data<int32_t>()[x]; j < offsets.data<int32_t>()[x + 1]; ++j) {
      const int32_t p = perm.data<int32_t>()[j];
      EXPECT_EQ(idx.data<int32_t>()[p], x);
      if (j > offsets.data<int32_t>()[x]) {
        EXPECT_LT(perm.data<int32_t>()[j - 1], p);
      }
      ++seen[static_cast<size_t>(p)];
    }
  for (int s : seen) EXPECT_EQ(s, 1);
}

// The golden "random" router's choices sorted by expert: T tokens, top k, E experts, P = T k pairs, the
// routing weights w [T, k], the expert offsets [E + 1] and the sort's perm [P].
struct SortedRouting {
  int64_t t = 0, k = 0, e = 0, P = 0;
  Tensor w, offsets, perm;
};
SortedRouting sorted_golden_routing() {
  const Tensor& logits = golden("router.random.logits");
  const MoeRouterConfig cfg = config_of("random");
  SortedRouting r;
  r.t = logits.dim(0), r.k = cfg.top_k, r.e = logits.dim(1), r.P = r.t * r.k;
  Tensor idx = Tensor::empty({r.t, r.k}, DType::I32), counts = Tensor::empty({r.e}, DType::I32);
  r.w = Tensor::empty({r.t, r.k}, DType::F32);
  moe_router_noaux_tc(logits, golden("router.random.bias"), cfg, idx, r.w);
  r.offsets = Tensor::empty({r.e + 1}, DType::I32);
  r.perm = Tensor::empty({r.P}, DType::I32);
  moe_sort_by_expert(idx, r.e, counts, r.offsets, r.perm);
  return r;
}

// moe_gather_pairs and moe_combine_rows against what they replace (embedding_forward of each pair's
// token into expert order, embedding_forward back to pair order, moe_combine): bitwise, F32 and BF16,
// on the golden router's choices; a perm that is not a permutation names its entry.
TEST(MoeGather, PairsAndCombineRowsEqualTheGatheredPath) {
  const SortedRouting sr = sorted_golden_routing();
  const int64_t t = sr.t, k = sr.k, P = sr.P, H = 24;
  const Tensor &w = sr.w, &perm = sr.perm;
  std::vector<int32_t> token_of(static_cast<size_t>(P)), row_of_ref(static_cast<size_t>(P));
  for (int64_t r = 0; r < P; ++r) {
    token_of[r] = perm.data<int32_t>()[r] / static_cast<int32_t>(k);
    row_of_ref[perm.data<int32_t>()[r]] = static_cast<int32_t>(r);
  }
  for (DType dt : {DType::F32, DType::BF16}) {
    SCOPED_TRACE(dtype_name(dt));
    const Tensor h = testing::random_tensor({t, H}, 3).to(dt);
    Tensor xs = Tensor::empty({P, H}, dt), row_of = Tensor::empty({P}, DType::I32), want = Tensor::empty({P, H}, dt);
    moe_gather_pairs(h, perm, k, xs, row_of);
    embedding_forward(Tensor::from_vector(token_of, {P}), h, want);
    EXPECT_EQ(xs.to_float_vector(), want.to_float_vector());
    EXPECT_EQ(std::vector<int32_t>(row_of.data<int32_t>(), row_of.data<int32_t>() + P), row_of_ref);
    const Tensor ys = testing::random_tensor({P, H}, 4).to(dt);
    Tensor out = Tensor::empty({t, H}, DType::F32), y = Tensor::empty({P, H}, DType::F32),
           ref = Tensor::empty({t, H}, DType::F32);
    moe_combine_rows(ys, row_of, w, out);
    embedding_forward(row_of, ys, y);
    moe_combine(y, w, ref);
    EXPECT_EQ(out.to_float_vector(), ref.to_float_vector());
  }
  Tensor twice = Tensor::from_vector<int32_t>({0, 0}, {2});
  Tensor xs2 = Tensor::empty({2, 4}, DType::F32), r2 = Tensor::empty({2}, DType::I32);
  expect_error([&] { moe_gather_pairs(testing::random_tensor({1, 4}, 1), twice, 2, xs2, r2); }, "perm[1] = 0");
  expect_error([&] { moe_gather_pairs(testing::random_tensor({1, 4}, 1), twice, 2, xs2, xs2); }, "row_of");
}

// Expert parallelism's split of the routed sum: each of two "ranks" computes only its experts' rows
// (moe_local_rows of its range, a ys of that many rows) and the two partial combines add up to the
// whole combine (each pair's term lands in exactly one part; the sum of two fp32 partials of k = 4
// terms against one fp32 sum: a few ulp). Bad ranges and a row_of past ys are refused.
TEST(MoeGather, LocalRowsSplitTheCombineByRange) {
  const SortedRouting sr = sorted_golden_routing();
  const int64_t t = sr.t, k = sr.k, e = sr.e, P = sr.P, H = 24;
  const Tensor &w = sr.w, &offsets = sr.offsets, &perm = sr.perm;
  const Tensor h = testing::random_tensor({t, H}, 3);
  Tensor xs, row_of = Tensor::empty({P}, DType::I32);
  moe_gather_pairs(h, perm, k, xs, row_of);
  const Tensor ys = testing::random_tensor({P, H}, 4);
  Tensor whole = Tensor::empty({t, H}, DType::F32);
  moe_combine_rows(ys, row_of, w, whole);
  const int64_t mid = offsets.data<int32_t>()[e / 2];  // the rows of experts [0, e/2) and [e/2, e)
  ASSERT_GT(mid, 0);
  ASSERT_LT(mid, P);
  std::vector<float> sum(static_cast<size_t>(t * H), 0.0f);
  int64_t kept = 0;
  for (auto [r0, r1] : {std::pair<int64_t, int64_t>{0, mid}, {mid, P}}) {
    Tensor local = row_of.clone();
    moe_local_rows(local, r0, r1);
    for (int64_t p = 0; p < P; ++p) {
      const int32_t full = row_of.data<int32_t>()[p], got = local.data<int32_t>()[p];
      EXPECT_EQ(got, full >= r0 && full < r1 ? full - r0 : -1) << "pair " << p;
      kept += got >= 0;
    }
    Tensor part = Tensor::empty({t, H}, DType::F32);
    moe_combine_rows(ys.slice(r0, r1), local, w, part);
    for (int64_t i = 0; i < t * H; ++i) sum[i] += part.data<float>()[i];
  }
  EXPECT_EQ(kept, P);  // every pair in exactly one range
  testing::expect_close(sum, whole.to_float_vector(), 1e-6f, 1e-5f, "two partial combines");
  Tensor r = row_of.clone();
  expect_error([&] { moe_local_rows(r, 3, 2); }, "are not a range");
  expect_error([&] { moe_local_rows(r, 0, P + 1); }, "are not a range");
  Tensor out = Tensor::empty({t, H}, DType::F32);
  expect_error([&] { moe_combine_rows(ys.slice(0, 1), row_of, w, out); }, "is not a row of ys");
}

}  // namespace
}  // namespace aerie
