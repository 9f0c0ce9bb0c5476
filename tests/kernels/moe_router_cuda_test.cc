// MoE router and expert sort on CUDA against the CPU reference (kernels/cpu/moe_router.cc): the goldens'
// logits (ties included: the same rule on both) and random logits at DeepSeek-V3 (256 experts, 8 groups,
// keep 4, top 8) and Kimi-K2 (384, 1 group, top 8) sizes; the softmax top-k router likewise (Qwen3-MoE and
// Mixtral sizes). Indices exactly, weights to a few ulp (CUDA's
// expf and glibc's differ in the last ulp); the sort bitwise. Skipped without a GPU.
#include "cuda_test_util.h"
#include "kernels/moe_router.h"
#include "quant_fixture.h"

namespace aerie {
namespace {

using testing::gpu;

struct Case {
  std::string name;
  Tensor logits, bias;
  MoeRouterConfig cfg;
};

std::vector<Case> cases() {
  std::vector<Case> out;
  for (const std::string c : {"random", "negative_bias", "no_norm"}) {
    const int32_t* f = testing::golden("router." + c + ".config").data<int32_t>();
    out.push_back({c, testing::golden("router." + c + ".logits"), testing::golden("router." + c + ".bias"),
                   {f[1], f[2], f[3], f[4] != 0, testing::golden("router." + c + ".routed_scaling_factor").data<float>()[0]}});
  }
  out.push_back({"deepseek-v3", testing::random_tensor({300, 256}, 21, -4.0f, 4.0f),
                 testing::random_tensor({256}, 22, -0.1f, 0.1f), {8, 4, 8, true, 2.5f}});
  out.push_back({"kimi-k2", testing::random_tensor({77, 384}, 23, -4.0f, 4.0f),
                 testing::random_tensor({384}, 24, -0.1f, 0.1f), {1, 1, 8, true, 2.827f}});
  return out;
}

TEST(MoeRouterCuda, MatchesCpu) {
  AERIE_REQUIRE_CUDA();
  for (const Case& c : cases()) {
    const int64_t t = c.logits.dim(0), k = c.cfg.top_k;
    Tensor idx = Tensor::empty({t, k}, DType::I32), w = Tensor::empty({t, k}, DType::F32);
    moe_router_noaux_tc(c.logits, c.bias, c.cfg, idx, w);
    Tensor ig = Tensor::empty({t, k}, DType::I32, Device::CUDA), wg = Tensor::empty({t, k}, DType::F32, Device::CUDA);
    moe_router_noaux_tc(gpu(c.logits), gpu(c.bias), c.cfg, ig, wg);
    const Tensor ih = ig.to_device(Device::CPU);
    EXPECT_TRUE(std::equal(idx.data<int32_t>(), idx.data<int32_t>() + t * k, ih.data<int32_t>())) << c.name;
    testing::expect_close(wg.to_float_vector(), w.to_float_vector(), 0.0f, 1e-6f, c.name + " weights");

    const int64_t e = c.logits.dim(1);
    Tensor counts = Tensor::empty({e}, DType::I32), offsets = Tensor::empty({e + 1}, DType::I32);
    Tensor perm = Tensor::empty({t * k}, DType::I32);
    moe_sort_by_expert(idx, e, counts, offsets, perm);
    Tensor cg = Tensor::empty({e}, DType::I32, Device::CUDA), og = Tensor::empty({e + 1}, DType::I32, Device::CUDA);
    Tensor pg = Tensor::empty({t * k}, DType::I32, Device::CUDA);
    moe_sort_by_expert(gpu(idx), e, cg, og, pg);
    EXPECT_EQ(cg.to_float_vector(), counts.to_float_vector()) << c.name;
    EXPECT_EQ(og.to_float_vector(), offsets.to_float_vector()) << c.name;
    EXPECT_EQ(pg.to_float_vector(), perm.to_float_vector()) << c.name;
  }
}

TEST(MoeRouterSoftmaxCuda, MatchesCpu) {
  // The goldens' logits (near ties included) and random logits at Qwen3-MoE (128 experts, top 8) and
  // Mixtral (8, top 2) sizes, renormalized and not.
  AERIE_REQUIRE_CUDA();
  std::vector<std::pair<Tensor, MoeRouterConfig>> runs;
  for (const std::string c : {"qwen3", "mixtral"}) {
    const Tensor& l = testing::softmax_router_golden(c + ".logits");
    runs.push_back({l, {1, 1, testing::softmax_router_golden(c + ".indices").dim(1), true, 1.0f}});
  }
  runs.push_back({testing::random_tensor({300, 128}, 31, -4.0f, 4.0f), {1, 1, 8, true, 1.0f}});
  runs.push_back({testing::random_tensor({300, 128}, 32, -4.0f, 4.0f), {1, 1, 8, false, 1.0f}});
  runs.push_back({testing::random_tensor({77, 8}, 33, -4.0f, 4.0f), {1, 1, 2, true, 1.0f}});
  for (size_t i = 0; i < runs.size(); ++i) {
    const Tensor& logits = runs[i].first;
    const MoeRouterConfig& cfg = runs[i].second;
    const int64_t t = logits.dim(0), k = cfg.top_k;
    Tensor idx = Tensor::empty({t, k}, DType::I32), w = Tensor::empty({t, k}, DType::F32);
    moe_router_softmax_topk(logits, cfg, idx, w);
    Tensor ig = Tensor::empty({t, k}, DType::I32, Device::CUDA), wg = Tensor::empty({t, k}, DType::F32, Device::CUDA);
    moe_router_softmax_topk(gpu(logits), cfg, ig, wg);
    const Tensor ih = ig.to_device(Device::CPU);
    const std::string what = "case " + std::to_string(i);
    EXPECT_TRUE(std::equal(idx.data<int32_t>(), idx.data<int32_t>() + t * k, ih.data<int32_t>())) << what;
    testing::expect_close(wg.to_float_vector(), w.to_float_vector(), 0.0f, 1e-6f, what + " weights");
  }
}

TEST(MoeSortCuda, DropsOutOfRangeIndices) {
  AERIE_REQUIRE_CUDA();
  Tensor idx = gpu(Tensor::from_vector<int32_t>({1, 7, 0, -1, 1, 0}, {3, 2}));
  Tensor cg = Tensor::empty({2}, DType::I32, Device::CUDA), og = Tensor::empty({3}, DType::I32, Device::CUDA);
  Tensor pg = Tensor::empty({6}, DType::I32, Device::CUDA);
  moe_sort_by_expert(idx, 2, cg, og, pg);
  EXPECT_EQ(cg.to_float_vector(), (std::vector<float>{2, 2}));
  EXPECT_EQ(og.to_float_vector(), (std::vector<float>{0, 2, 4}));
  EXPECT_EQ(pg.to_float_vector(), (std::vector<float>{2, 5, 0, 4, -1, -1}));
  // The dropped pairs keep row_of -1 and add nothing to the routed sum.
  const int64_t H = 16;
  const Tensor h = testing::random_tensor({3, H}, 1), ys = testing::random_tensor({6, H}, 2);
  const Tensor w = Tensor::from_vector<float>({0.5f, 0.25f, 1.0f, 2.0f, 0.75f, 1.5f}, {3, 2});
  Tensor xs = Tensor::empty({6, H}, DType::F32, Device::CUDA), rg = Tensor::empty({6}, DType::I32, Device::CUDA);
  moe_gather_pairs(gpu(h), pg, 2, xs, rg);
  EXPECT_EQ(rg.to_float_vector(), (std::vector<float>{2, -1, 0, -1, 3, 1}));
  Tensor out = Tensor::empty({3, H}, DType::F32, Device::CUDA);
  moe_combine_rows(gpu(ys), rg, gpu(w), out);
  const auto o = out.to_float_vector(), y = ys.to_float_vector(), wv = w.to_float_vector();
  const int rows[6] = {2, -1, 0, -1, 3, 1};
  for (int t = 0; t < 3; ++t)
    for (int64_t j = 0; j < H; ++j) {
      float want = 0.0f;
      for (int s = 0; s < 2; ++s)
        if (rows[2 * t + s] >= 0) want += wv[2 * t + s] * y[rows[2 * t + s] * H + j];
      EXPECT_NEAR(o[t * H + j], want, 1e-6f) << "token " << t << " column " << j;
    }
}

// moe_gather_pairs / moe_combine_rows on CUDA against the CPU at Kimi-K2's size (384 experts, top 8, 300
// tokens, H 7168 and an odd 70 (the per-element path)): the gather and row_of bitwise; the combine within
// a few fp32 ulp of its k = 8 terms (FMA contraction on the GPU).
TEST(MoeGatherCuda, MatchesCpu) {
  AERIE_REQUIRE_CUDA();
  const int64_t t = 300, e = 384, k = 8, P = t * k;
  Tensor idx = Tensor::empty({t, k}, DType::I32), w = Tensor::empty({t, k}, DType::F32);
  moe_router_noaux_tc(testing::random_tensor({t, e}, 5, -4.0f, 4.0f), testing::random_tensor({e}, 6, -0.1f, 0.1f),
                      {1, 1, 8, true, 2.827f}, idx, w);
  Tensor counts = Tensor::empty({e}, DType::I32), offsets = Tensor::empty({e + 1}, DType::I32);
  Tensor perm = Tensor::empty({P}, DType::I32);
  moe_sort_by_expert(idx, e, counts, offsets, perm);
  for (int64_t H : {7168, 70})
    for (DType dt : {DType::F32, DType::BF16}) {
      SCOPED_TRACE(std::to_string(H) + " " + dtype_name(dt));
      const Tensor h = testing::random_tensor({t, H}, 7).to(dt), ys = testing::random_tensor({P, H}, 8).to(dt);
      Tensor xs = Tensor::empty({P, H}, dt), row_of = Tensor::empty({P}, DType::I32);
      Tensor xg = Tensor::empty({P, H}, dt, Device::CUDA), rg = Tensor::empty({P}, DType::I32, Device::CUDA);
      moe_gather_pairs(h, perm, k, xs, row_of);
      moe_gather_pairs(gpu(h), gpu(perm), k, xg, rg);
      EXPECT_EQ(xg.to_device(Device::CPU).to_float_vector(), xs.to_float_vector());
      EXPECT_EQ(rg.to_device(Device::CPU).to_float_vector(), row_of.to_float_vector());
      Tensor out = Tensor::empty({t, H}, DType::F32), og = Tensor::empty({t, H}, DType::F32, Device::CUDA);
      moe_combine_rows(ys, row_of, w, out);
      moe_combine_rows(gpu(ys), rg, gpu(w), og);
      testing::expect_close(og.to_device(Device::CPU).to_float_vector(), out.to_float_vector(), 1e-6f, 1e-5f, "combine");
      // Expert parallelism: one rank's rows [P/3, 2P/3) (moe_local_rows), bitwise the CPU's, and its
      // partial combine from a ys of those rows.
      const int64_t r0 = P / 3, r1 = 2 * P / 3;
      moe_local_rows(row_of, r0, r1);
      moe_local_rows(rg, r0, r1);
      EXPECT_EQ(rg.to_device(Device::CPU).to_float_vector(), row_of.to_float_vector());
      moe_combine_rows(ys.slice(r0, r1), row_of, w, out);
      moe_combine_rows(gpu(ys).slice(r0, r1), rg, gpu(w), og);
      testing::expect_close(og.to_device(Device::CPU).to_float_vector(), out.to_float_vector(), 1e-6f, 1e-5f,
                            "local combine");
    }
}

}  // namespace
}  // namespace aerie
