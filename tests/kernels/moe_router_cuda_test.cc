// MoE router and expert sort on CUDA against the CPU reference (kernels/cpu/moe_router.cc): the goldens'
// logits (ties included: the same rule on both) and random logits at DeepSeek-V3 (256 experts, 8 groups,
// keep 4, top 8) and Kimi-K2 (384, 1 group, top 8) sizes. Indices exactly, weights to a few ulp (CUDA's
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

TEST(MoeSortCuda, DropsOutOfRangeIndices) {
  AERIE_REQUIRE_CUDA();
  Tensor idx = gpu(Tensor::from_vector<int32_t>({1, 7, 0, -1, 1, 0}, {3, 2}));
  Tensor cg = Tensor::empty({2}, DType::I32, Device::CUDA), og = Tensor::empty({3}, DType::I32, Device::CUDA);
  Tensor pg = Tensor::empty({6}, DType::I32, Device::CUDA);
  moe_sort_by_expert(idx, 2, cg, og, pg);
  EXPECT_EQ(cg.to_float_vector(), (std::vector<float>{2, 2}));
  EXPECT_EQ(og.to_float_vector(), (std::vector<float>{0, 2, 4}));
  EXPECT_EQ(pg.to_float_vector(), (std::vector<float>{2, 5, 0, 4, -1, -1}));
}

}  // namespace
}  // namespace aerie
