// The MoE block (make_moe_ffn: DeepSeek-V3's noaux_tc routing, routed and shared experts) against a naive loop
// over the experts written here from the formulas (../shared/docs/deepseek-v3.md, routing): per token, sigmoid
// scores, choice = score + e_score_correction_bias, groups ranked by the sum of their two best choices, the
// top_k choices inside the kept groups, weights = the chosen scores normalized and scaled by
// routed_scaling_factor, y = sum_k w_k down(silu(gate x) * up x) + the shared expert's. F32 weights from a
// checkpoint folder written here; the model tests check the same block inside whole models against
// transformers (deepseek_test.cc), this one isolates it.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "io/safetensors.h"
#include "model/blocks.h"
#include "model/op_profile.h"
#include "model/weight_source.h"
#include "model_testing.h"
#include "test_util.h"

namespace aerie {
namespace {

constexpr int64_t H = 16, E = 8, I = 12, T = 24, kTopK = 2, kGroups = 4, kTopGroups = 2;
constexpr float kScaling = 2.5f;

std::vector<float> normal(size_t n, std::mt19937& rng, float std) {
  std::normal_distribution<float> d(0.0f, std);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

/// x [K] -> W x for W [N, K] row-major.
std::vector<double> matvec(const std::vector<float>& W, int64_t N, int64_t K, const std::vector<double>& x) {
  std::vector<double> y(static_cast<size_t>(N), 0.0);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t k = 0; k < K; ++k) y[n] += static_cast<double>(W[n * K + k]) * x[k];
  return y;
}

struct Mlp {
  std::vector<float> gate, up, down;  // [I', H], [I', H], [H, I']
  int64_t inter;
  std::vector<double> operator()(const std::vector<double>& x) const {
    const auto g = matvec(gate, inter, H, x), u = matvec(up, inter, H, x);
    std::vector<double> a(static_cast<size_t>(inter));
    for (int64_t i = 0; i < inter; ++i) a[i] = g[i] / (1.0 + std::exp(-g[i])) * u[i];
    return matvec(down, H, inter, a);
  }
};

TEST(MoeBlock, EqualsANaiveLoopOverExperts) {
  const std::string dir = testing::scratch_dir("moe_block");
  std::mt19937 rng(5);
  SafetensorsFile f;
  auto put = [&](const std::string& name, const std::vector<float>& v, const Shape& shape) {
    f.tensors[name] = Tensor::from_vector(v, shape);
  };
  const std::string p = "model.layers.1.mlp.";
  const std::vector<float> router = normal(E * H, rng, 0.5f), bias = normal(E, rng, 0.1f);
  put(p + "gate.weight", router, {E, H});
  put(p + "gate.e_score_correction_bias", bias, {E});
  std::vector<Mlp> experts;
  for (int64_t e = 0; e <= E; ++e) {  // e == E: the shared expert
    Mlp m{normal(I * H, rng, 0.3f), normal(I * H, rng, 0.3f), normal(H * I, rng, 0.3f), I};
    const std::string x = e < E ? p + "experts." + std::to_string(e) + "." : p + "shared_experts.";
    put(x + "gate_proj.weight", m.gate, {I, H});
    put(x + "up_proj.weight", m.up, {I, H});
    put(x + "down_proj.weight", m.down, {H, I});
    experts.push_back(std::move(m));
  }
  put("model.embed_tokens.weight", std::vector<float>(4 * H, 0.0f), {4, H});  // how the source finds the decoder
  save_safetensors(dir + "/model.safetensors", f);

  auto src = checkpoint_weights(dir, 0, 1, Device::CPU, DType::F32);
  MoeSpec spec;
  spec.hidden = H, spec.experts = E, spec.shared_experts = 1, spec.moe_intermediate = I;
  spec.n_group = kGroups, spec.topk_group = kTopGroups, spec.top_k = kTopK, spec.norm_topk_prob = true;
  spec.routed_scaling_factor = kScaling;
  auto ffn = make_moe_ffn(*src, spec, p);
  const std::vector<float> x = normal(T * H, rng, 1.0f);
  auto comm = testing::self_comm();
  OpProfile prof;
  ForwardBatch batch;
  batch.B = 1, batch.n = T, batch.longest = T, batch.start = {0, T}, batch.p0 = {0};
  ForwardContext ctx(Device::CPU, DType::F32, *comm, prof, batch);
  Tensor h = Tensor::from_vector(x, {T, H}), out = Tensor::zeros({T, H}, DType::F32);
  ffn->forward(ctx, h, out);

  const int64_t gsize = E / kGroups;
  double worst = 0.0, smallest_margin = 1e9;
  for (int64_t t = 0; t < T; ++t) {
    const std::vector<double> xt(x.begin() + t * H, x.begin() + (t + 1) * H);
    const auto logits = matvec(router, E, H, xt);
    std::vector<double> score(E), choice(E);
    for (int64_t e = 0; e < E; ++e) score[e] = 1.0 / (1.0 + std::exp(-logits[e])), choice[e] = score[e] + bias[e];
    std::vector<std::pair<double, int64_t>> groups;
    for (int64_t g = 0; g < kGroups; ++g) {
      std::vector<double> c(choice.begin() + g * gsize, choice.begin() + (g + 1) * gsize);
      std::sort(c.rbegin(), c.rend());
      groups.push_back({c[0] + c[1], g});
    }
    std::sort(groups.rbegin(), groups.rend());
    smallest_margin = std::min(smallest_margin, groups[kTopGroups - 1].first - groups[kTopGroups].first);
    std::vector<std::pair<double, int64_t>> cand;
    for (int64_t i = 0; i < kTopGroups; ++i)
      for (int64_t e = groups[i].second * gsize; e < (groups[i].second + 1) * gsize; ++e) cand.push_back({choice[e], e});
    std::sort(cand.rbegin(), cand.rend());
    smallest_margin = std::min(smallest_margin, cand[kTopK - 1].first - cand[kTopK].first);
    double norm = 0.0;
    for (int64_t k = 0; k < kTopK; ++k) norm += score[cand[k].second];
    std::vector<double> y = experts[E](xt);
    for (int64_t k = 0; k < kTopK; ++k) {
      const auto ye = experts[cand[k].second](xt);
      const double w = score[cand[k].second] / norm * kScaling;
      for (int64_t j = 0; j < H; ++j) y[j] += w * ye[j];
    }
    for (int64_t j = 0; j < H; ++j)
      worst = std::max(worst, std::abs(out.data<float>()[t * H + j] - y[j]) / (1e-3 + std::abs(y[j])));
  }
  // The seed's routing is far from ties (an fp32 router could otherwise pick another expert than fp64 here).
  ASSERT_GT(smallest_margin, 1e-4);
  EXPECT_LT(worst, 1e-4) << "largest relative error of the block against the naive loop";
}

}  // namespace
}  // namespace aerie
