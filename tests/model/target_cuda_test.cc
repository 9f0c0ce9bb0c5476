// The target on a device and in bf16 (TargetModelOptions): the CUDA forward against the CPU forward on
// stories260K and the Hugging Face family fixtures (F32 mode: fp32 tolerance; BF16 mode: a relative
// L2 bound), KV-cache decoding against the prefill, and the random-weights constructor. The BF16 mode
// and the random weights also run on the CPU (widened kernels), so those tests run without a GPU.
//
// Tolerances:
//  - F32 CUDA vs F32 CPU: both compute in fp32 (cuBLASLt with CUBLAS_COMPUTE_32F, no TF32); they differ
//    by summation order only: ~1e-6 relative per op, grown through the layers to a few 1e-6 of the
//    values' scale. atol 1e-4 / rtol 1e-4 (the bound tests/model/target_hf_families_test.cc uses against
//    transformers, which differs from aerie in the same way) leaves a wide margin.
//  - BF16 vs F32: the bf16 mode rounds 7 GEMM inputs per layer (h, q, k, v, attention out, g*u, and h
//    again) to 8 significant bits, unit roundoff u = 2^-9 = 2e-3. Rounding errors of independent
//    elements add like a random walk, so after N layers the relative error of a hidden state is about
//    sqrt(7 N) u ~ 1e-2 for N = 5 (measured on the CPU, worst of r^k, z, logits: stories260K 0.8e-2,
//    the HF fixtures 0.9e-2 to 1.7e-2). We bound the relative L2 error ||got - ref|| / ||ref|| of each
//    output by kBf16RelL2 = 4e-2; elementwise bounds would fail on the elements near zero, whose
//    relative error is unbounded.
//  - BF16 CUDA vs BF16 CPU: the same rounding points, different fp32 summation orders, so an element
//    differs only when the order flips a bf16 rounding (one ulp, 2^-8 relative) and that propagates:
//    relative L2 below 2e-2.
#include <cmath>
#include <random>

#include "comm/communicator.h"
#include "comm/nccl_communicator.h"
#include "core/device.h"
#include "io/safetensors.h"
#include "kernels/tensor_ops.h"
#include "model/target.h"
#include "model/weight_source.h"
#include "model_testing.h"
#include "test_util.h"

namespace aerie {
namespace {

using testing::self_comm;
using testing::hf_fixture;
using testing::some_ids;
using testing::rel_l2;

constexpr float kAtol = 1e-4f, kRtol = 1e-4f;
constexpr double kBf16RelL2 = 4e-2, kBf16DeviceRelL2 = 2e-2;

bool all_finite(const std::vector<float>& v) {
  for (float x : v)
    if (!std::isfinite(x)) return false;
  return true;
}

/// Every r^k (k = 0..N), z and the logits of one prefill.
TargetOutput run_all(TargetModel& m, const std::vector<int32_t>& ids) {
  std::vector<int> aux;
  for (int k = 0; k <= m.config().num_hidden_layers; ++k) aux.push_back(k);
  return m.forward(ids, nullptr, aux, true);
}

void expect_outputs_close(const TargetOutput& got, const TargetOutput& ref, const std::string& what) {
  testing::expect_close(got.aux_hidden.to_float_vector(), ref.aux_hidden.to_float_vector(), kAtol, kRtol,
                        what + ": r^k");
  testing::expect_close(got.final_hidden.to_float_vector(), ref.final_hidden.to_float_vector(), kAtol, kRtol,
                        what + ": z");
  testing::expect_close(got.logits.to_float_vector(), ref.logits.to_float_vector(), kAtol, kRtol, what + ": logits");
}

/// Relative L2 errors of aux, final and logits; EXPECTs each <= bound. Returns the largest.
double expect_rel_l2(const TargetOutput& got, const TargetOutput& ref, double bound, const std::string& what) {
  double worst = 0;
  for (auto [g, r, name] : {std::tuple{&got.aux_hidden, &ref.aux_hidden, "r^k"},
                            std::tuple{&got.final_hidden, &ref.final_hidden, "z"},
                            std::tuple{&got.logits, &ref.logits, "logits"}}) {
    std::vector<float> gv = g->to_float_vector(), rv = r->to_float_vector();
    EXPECT_TRUE(all_finite(gv)) << what << ": " << name << " has non-finite values";
    double e = rel_l2(gv, rv);
    EXPECT_LE(e, bound) << what << ": " << name << " relative L2 error";
    worst = std::max(worst, e);
  }
  return worst;
}

/// KV-cache decoding (a prefill of `split` ids, then one id at a time) gives the prefill's z and logits.
void expect_cache_matches_prefill(TargetModel& m, const std::vector<int32_t>& ids, int64_t split, float atol,
                                  float rtol, const std::string& what) {
  TargetOutput full = m.forward(ids, nullptr, {}, true);
  const int64_t T = static_cast<int64_t>(ids.size());
  KVCache cache = m.make_cache(T);
  EXPECT_EQ(cache.k[0].device(), m.device());
  EXPECT_EQ(cache.k[0].dtype(), m.dtype());
  TargetOutput pre = m.forward(std::vector<int32_t>(ids.begin(), ids.begin() + split), &cache, {}, true);
  testing::expect_close(pre.logits.to_float_vector(), full.logits.slice(0, split).to_float_vector(), atol, rtol,
                        what + ": cached prefill logits");
  for (int64_t t = split; t < T; ++t) {
    TargetOutput o = m.forward({ids[t]}, &cache, {}, true);
    testing::expect_close(o.final_hidden.to_float_vector(), full.final_hidden.slice(t, t + 1).to_float_vector(), atol,
                          rtol, what + ": cached z at " + std::to_string(t));
    testing::expect_close(o.logits.to_float_vector(), full.logits.slice(t, t + 1).to_float_vector(), atol, rtol,
                          what + ": cached logits at " + std::to_string(t));
  }
  EXPECT_EQ(cache.length(), T);
}

const std::vector<std::string> kFamilies = {"llama3_tied", "llama2_linear", "mistral_swa", "qwen2", "qwen3"};

// ---- CPU: the BF16 mode and the random weights (run everywhere) ----

TEST(TargetBf16, CpuBf16ModeNearF32OnStories260K) {
  AERIE_REQUIRE_MODEL();
  auto self = self_comm();
  TargetModel f32(testing::model_dir(), *self);
  TargetModel b16(testing::model_dir(), *self, {Device::CPU, DType::BF16});
  EXPECT_EQ(b16.dtype(), DType::BF16);
  EXPECT_EQ(b16.embed_tokens().dtype(), DType::BF16);
  auto ids = some_ids(40, f32.config().vocab_size, 3);
  TargetOutput ref = run_all(f32, ids), got = run_all(b16, ids);
  EXPECT_EQ(got.aux_hidden.dtype(), DType::BF16);
  EXPECT_EQ(got.final_hidden.dtype(), DType::BF16);
  EXPECT_EQ(got.logits.dtype(), DType::F32);
  const double worst = expect_rel_l2(got, ref, kBf16RelL2, "stories260K bf16 (cpu)");
  std::printf("stories260K: bf16 mode vs f32, worst relative L2 error %.3g\n", worst);
  EXPECT_GT(worst, 0.0);  // the mode really rounds
}

TEST(TargetBf16, CpuBf16ModeNearF32OnHfFamilies) {
  auto self = self_comm();
  for (const auto& name : kFamilies) {
    TargetModel f32(hf_fixture(name), *self);
    TargetModel b16(hf_fixture(name), *self, {Device::CPU, DType::BF16});
    auto ids = some_ids(24, f32.config().vocab_size, 5);
    const double worst = expect_rel_l2(run_all(b16, ids), run_all(f32, ids), kBf16RelL2, name + " bf16 (cpu)");
    std::printf("%s: bf16 mode vs f32, worst relative L2 error %.3g\n", name.c_str(), worst);
  }
}

TEST(TargetBf16, CpuBf16KvCacheMatchesPrefill) {
  auto self = self_comm();
  TargetModel m(hf_fixture("qwen3"), *self, {Device::CPU, DType::BF16});
  // Same rounding points in both paths (the cache holds the same bf16 k/v); only fp32 summation order
  // differs between a prefill row and a decode step: a few bf16 ulps on z.
  expect_cache_matches_prefill(m, some_ids(20, m.config().vocab_size, 9), 7, 3e-2f, 2e-2f, "qwen3 bf16 (cpu)");
}

TEST(TargetRandom, SeededShapesAndDeterminism) {
  auto self = self_comm();
  TargetConfig cfg = load_target_config(hf_fixture("qwen2"));  // q/k/v biases
  TargetModel a = TargetModel::random(cfg, *self, {Device::CPU, DType::F32}, 11);
  TargetModel b = TargetModel::random(cfg, *self, {Device::CPU, DType::F32}, 11);
  TargetModel c = TargetModel::random(cfg, *self, {Device::CPU, DType::F32}, 12);
  EXPECT_EQ(a.embed_tokens().shape(), (Shape{cfg.vocab_size, cfg.hidden_size}));
  std::vector<float> e = a.embed_tokens().to_float_vector();
  double mean = 0, sq = 0;
  for (float x : e) mean += x, sq += static_cast<double>(x) * x;
  mean /= static_cast<double>(e.size());
  EXPECT_NEAR(mean, 0.0, 2e-3);
  EXPECT_NEAR(std::sqrt(sq / static_cast<double>(e.size()) - mean * mean), 0.02, 2e-3);  // std 0.02
  auto ids = some_ids(16, cfg.vocab_size, 1);
  TargetOutput oa = run_all(a, ids), ob = run_all(b, ids), oc = run_all(c, ids);
  EXPECT_EQ(oa.final_hidden.to_float_vector(), ob.final_hidden.to_float_vector());
  EXPECT_NE(oa.final_hidden.to_float_vector(), oc.final_hidden.to_float_vector());
  EXPECT_TRUE(all_finite(oa.logits.to_float_vector()));
  TargetModel bf = TargetModel::random(cfg, *self, {Device::CPU, DType::BF16}, 11);
  EXPECT_EQ(bf.embed_tokens().dtype(), DType::BF16);
  // The bf16 weights are the f32 ones rounded: the forwards agree to the bf16 bound.
  expect_rel_l2(run_all(bf, ids), oa, kBf16RelL2, "random qwen2 bf16 vs f32");
}

TEST(TargetRandom, TpShardsAreSlicesOfTheTp1Model) {
  // Random weights do not depend on the tp size: rank r of tp 2 holds rows (q/k/v/gate/up) or columns
  // (o/down) r of the tensors tp 1 makes from the same seed, asked for in the same order, so tp runs of
  // --random-weights compare.
  TargetConfig cfg = load_target_config(hf_fixture("qwen2"));
  const int64_t H = cfg.hidden_size, V = cfg.vocab_size, I = cfg.intermediate_size;
  const int64_t qd = cfg.num_attention_heads * cfg.head_dim;
  const std::vector<std::pair<Shape, TpSplit>> asks = {
      {{V, H}, TpSplit::None}, {{qd, H}, TpSplit::Rows}, {{H, qd}, TpSplit::Cols},
      {{I, H}, TpSplit::Rows}, {{H, I}, TpSplit::Cols},  {{V, H}, TpSplit::None}};
  auto draw = [&](int rank, int size) {
    auto src = random_weights(7, rank, size, Device::CPU, DType::F32);
    std::vector<Tensor> out;
    for (const auto& [shape, split] : asks) out.push_back(src->load("w", shape, split, ParamRole::Linear));
    return out;
  };
  const std::vector<Tensor> one = draw(0, 1);
  for (int r = 0; r < 2; ++r) {
    const std::vector<Tensor> part = draw(r, 2);
    for (size_t i = 0; i < asks.size(); ++i) {
      const Tensor &full = one[i], &shard = part[i];
      Tensor want = full;
      if (asks[i].second == TpSplit::Rows) want = full.slice(r * shard.dim(0), (r + 1) * shard.dim(0));
      if (asks[i].second == TpSplit::Cols) {
        want = Tensor::empty(shard.shape(), DType::F32);
        copy_columns(full, r * shard.dim(1), want, 0, shard.dim(1));
      }
      EXPECT_EQ(shard.to_float_vector(), want.to_float_vector()) << "tensor " << i << ", rank " << r;
    }
  }
}

// ---- CUDA (skipped without a GPU) ----

TEST(TargetCuda, F32EqualsCpuOnStories260K) {
  AERIE_REQUIRE_CUDA();
  AERIE_REQUIRE_MODEL();
  auto self = self_comm();
  TargetModel cpu(testing::model_dir(), *self);
  TargetModel gpu(testing::model_dir(), *self, {Device::CUDA, DType::F32});
  EXPECT_EQ(gpu.embed_tokens().device(), Device::CUDA);
  for (int64_t T : {1, 37, 300}) {
    auto ids = some_ids(T, cpu.config().vocab_size, static_cast<uint32_t>(T));
    TargetOutput g = run_all(gpu, ids);
    EXPECT_EQ(g.aux_hidden.device(), Device::CUDA);
    EXPECT_EQ(g.final_hidden.dtype(), DType::F32);
    expect_outputs_close(g, run_all(cpu, ids), "stories260K cuda f32 T=" + std::to_string(T));
  }
}

TEST(TargetCuda, F32EqualsCpuOnHfFamilies) {
  AERIE_REQUIRE_CUDA();
  auto self = self_comm();
  for (const auto& name : kFamilies) {
    TargetModel cpu(hf_fixture(name), *self);
    TargetModel gpu(hf_fixture(name), *self, {Device::CUDA, DType::F32});
    auto ids = some_ids(40, cpu.config().vocab_size, 7);  // longer than mistral_swa's window
    expect_outputs_close(run_all(gpu, ids), run_all(cpu, ids), name + " cuda f32");
  }
}

TEST(TargetCuda, Bf16NearCpu) {
  AERIE_REQUIRE_CUDA();
  auto self = self_comm();
  std::vector<std::string> dirs;
  if (testing::have_model()) dirs.push_back(testing::model_dir());
  for (const auto& name : kFamilies) dirs.push_back(hf_fixture(name));
  for (const auto& dir : dirs) {
    TargetModel cpu(dir, *self), cpu_b16(dir, *self, {Device::CPU, DType::BF16});
    TargetModel gpu(dir, *self, {Device::CUDA, DType::BF16});
    auto ids = some_ids(64, cpu.config().vocab_size, 13);
    TargetOutput g = run_all(gpu, ids);
    EXPECT_EQ(g.aux_hidden.dtype(), DType::BF16);
    EXPECT_EQ(g.final_hidden.dtype(), DType::BF16);
    EXPECT_EQ(g.aux_hidden.device(), Device::CUDA);
    const double e32 = expect_rel_l2(g, run_all(cpu, ids), kBf16RelL2, dir + " cuda bf16 vs cpu f32");
    const double e16 = expect_rel_l2(g, run_all(cpu_b16, ids), kBf16DeviceRelL2, dir + " cuda bf16 vs cpu bf16");
    std::printf("%s: cuda bf16 vs cpu f32 %.3g, vs cpu bf16 %.3g (relative L2)\n", dir.c_str(), e32, e16);
  }
}

TEST(TargetCuda, KvCacheDecodingEqualsPrefill) {
  AERIE_REQUIRE_CUDA();
  auto self = self_comm();
  for (const auto& name : {std::string("llama3_tied"), std::string("qwen3"), std::string("mistral_swa")}) {
    TargetModel f32(hf_fixture(name), *self, {Device::CUDA, DType::F32});
    expect_cache_matches_prefill(f32, some_ids(30, f32.config().vocab_size, 2), 9, kAtol, kRtol, name + " cuda f32");
    TargetModel b16(hf_fixture(name), *self, {Device::CUDA, DType::BF16});
    // bf16: see CpuBf16KvCacheMatchesPrefill.
    expect_cache_matches_prefill(b16, some_ids(30, b16.config().vocab_size, 2), 9, 3e-2f, 2e-2f, name + " cuda bf16");
  }
}

TEST(TargetCuda, GreedyGenerateEqualsCpu) {
  AERIE_REQUIRE_CUDA();
  AERIE_REQUIRE_MODEL();
  auto self = self_comm();
  TargetModel cpu(testing::model_dir(), *self);
  TargetModel gpu(testing::model_dir(), *self, {Device::CUDA, DType::F32});
  std::vector<int32_t> prompt = {1, 403, 407, 261};
  EXPECT_EQ(greedy_generate(gpu, prompt, 20, -1), greedy_generate(cpu, prompt, 20, -1));
}

TEST(TargetCuda, RandomWeightsEqualCpu) {
  AERIE_REQUIRE_CUDA();
  auto self = self_comm();
  TargetConfig cfg = load_target_config(hf_fixture("qwen3"));
  TargetModel cpu = TargetModel::random(cfg, *self, {Device::CPU, DType::F32}, 5);
  TargetModel gpu = TargetModel::random(cfg, *self, {Device::CUDA, DType::F32}, 5);
  EXPECT_EQ(gpu.embed_tokens().to_float_vector(), cpu.embed_tokens().to_float_vector());
  auto ids = some_ids(33, cfg.vocab_size, 4);
  expect_outputs_close(run_all(gpu, ids), run_all(cpu, ids), "random qwen3 cuda f32");
  TargetModel gpu_b16 = TargetModel::random(cfg, *self, {Device::CUDA, DType::BF16}, 5);
  TargetModel cpu_b16 = TargetModel::random(cfg, *self, {Device::CPU, DType::BF16}, 5);
  EXPECT_EQ(gpu_b16.embed_tokens().to_float_vector(), cpu_b16.embed_tokens().to_float_vector());
  expect_rel_l2(run_all(gpu_b16, ids), run_all(cpu_b16, ids), kBf16DeviceRelL2, "random qwen3 cuda bf16");
}

// Tensor parallelism on GPUs: `mpirun -np 2 test_model --gtest_filter=TargetCudaTp.*` on a machine with
// two GPUs. The tp = 2 model (NCCL all-reduce of o_proj / down_proj partial sums) equals the tp = 1 model
// on each rank's GPU: F32 within the fp32 tolerance, BF16 within kBf16DeviceRelL2 (the partial sums are
// F32, so the only difference is the split of the fp32 sums).
TEST(TargetCudaTp, Tp2EqualsTp1) {
  AERIE_REQUIRE_CUDA();
  auto world = MpiCommunicator::world();
  if (world->size() != 2) GTEST_SKIP() << "needs mpirun -np 2 (got " << world->size() << " rank(s))";
  if (cuda::device_count() < 2) GTEST_SKIP() << "needs 2 GPUs (NCCL runs one rank per GPU)";
  NcclCommunicator nccl(*world);  // selects GPU local_rank()
  auto self = self_comm();
  std::vector<std::string> dirs = {hf_fixture("llama3_tied"), hf_fixture("qwen2")};
  if (testing::have_model()) dirs.push_back(testing::model_dir());
  for (const auto& dir : dirs) {
    for (DType dt : {DType::F32, DType::BF16}) {
      TargetModel one(dir, *self, {Device::CUDA, dt}), two(dir, nccl, {Device::CUDA, dt});
      auto ids = some_ids(50, one.config().vocab_size, 21);
      TargetOutput a = run_all(two, ids), b = run_all(one, ids);
      const std::string what = dir + (dt == DType::F32 ? " f32" : " bf16") + " tp2 vs tp1";
      if (dt == DType::F32)
        expect_outputs_close(a, b, what);
      else
        expect_rel_l2(a, b, kBf16DeviceRelL2, what);
    }
  }
}

}  // namespace
}  // namespace aerie
