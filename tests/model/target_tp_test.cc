// Tensor parallelism of the target: a model split over all world ranks (tp = world size) gives the
// same logits, aux hidden states and final hidden states as the unsplit model (tp = 1, built on a
// single-rank communicator on every rank). Run under mpirun (tests/mpi/model.cmake, -np 2); skipped on
// one rank.
#include <filesystem>

#include "comm/communicator.h"
#include "core/error.h"
#include "model/target.h"
#include "model/target_testing.h"
#include "test_util.h"

namespace aerie {
namespace {

using testing::expect_close_scaled;

/// A scratch folder shared by all ranks: rank 0 empties it, the others wait.
std::string shared_scratch(Communicator& world, const std::string& name) {
  std::string dir = (std::filesystem::path(testing::scratch_root()) / name).string();
  if (world.rank() == 0) testing::scratch_dir(name);
  world.barrier();
  return dir;
}

/// tp = world vs tp = 1 on `ids`: the sum of o_proj/down_proj partial products over ranks changes the
/// fp32 summation order only. That moves an element by a few ulps of the largest terms of its sums,
/// not of itself (stories260K's logits span 1e-2 .. 10; with OpenBLAS's SkylakeX kernels a logit of
/// 0.01756 moved by 1.9e-5), so the bound is 1e-5 of the tensor's largest magnitude plus 1e-5 relative.
void compare_tp(const std::string& dir, MpiCommunicator& world, const std::vector<int32_t>& ids,
                const TargetModelOptions& split_options = {}) {
  auto self = world.split(world.rank(), 0);
  TargetModel one(dir, *self), split(dir, world, split_options);
  const int N = static_cast<int>(one.config().num_hidden_layers);
  std::vector<int> aux = {0, 2, N};
  TargetOutput a = one.forward(ids, nullptr, aux, true);
  TargetOutput b = split.forward(ids, nullptr, aux, true);
  expect_close_scaled(b.logits.to_float_vector(), a.logits.to_float_vector(), 1e-5f, "logits");
  expect_close_scaled(b.aux_hidden.to_float_vector(), a.aux_hidden.to_float_vector(), 1e-5f, "aux_hidden");
  expect_close_scaled(b.final_hidden.to_float_vector(), a.final_hidden.to_float_vector(), 1e-5f,
                      "final_hidden");

  // With a KV cache: prefill half, decode the rest token by token.
  KVCache cache = split.make_cache(static_cast<int64_t>(ids.size()));
  const size_t h = ids.size() / 2;
  split.forward(std::vector<int32_t>(ids.begin(), ids.begin() + h), &cache, {}, false);
  for (size_t t = h; t < ids.size(); ++t) {
    TargetOutput o = split.forward({ids[t]}, &cache, {}, true);
    expect_close_scaled(o.logits.to_float_vector(), a.logits.slice(t, t + 1).to_float_vector(), 2e-5f,
                        "cached logits at " + std::to_string(t));
  }
  EXPECT_EQ(greedy_generate(split, {1}, 20, -1), greedy_generate(one, {1}, 20, -1));
}

TEST(TpTest, Stories260KMatchesUnsplit) {
  auto world = MpiCommunicator::world();
  if (world->size() < 2) GTEST_SKIP() << "needs mpirun -np 2 (or more)";
  AERIE_REQUIRE_MODEL();
  if (8 % world->size() != 0 || 4 % world->size() != 0 || 172 % world->size() != 0)
    GTEST_SKIP() << "stories260K does not split over " << world->size() << " ranks";
  compare_tp(testing::model_dir(), *world, {1, 403, 407, 261, 378, 410, 261, 285, 374, 264, 275, 401, 353, 46});
}

TEST(TpTest, RandomUntiedModelMatchesUnsplit) {
  auto world = MpiCommunicator::world();
  if (world->size() < 2) GTEST_SKIP() << "needs mpirun -np 2 (or more)";
  const int p = world->size();
  testing::TinyLlama m;
  m.n_heads = 2 * p;
  m.n_kv = p;
  m.I = 12 * p;
  std::string dir = shared_scratch(*world, "llama_tp_random");
  if (world->rank() == 0) testing::write_tiny_llama(dir, m);
  world->barrier();
  compare_tp(dir, *world, {1, 5, 9, 33, 60, 2, 17, 41, 8, 63, 12});
}

TEST(TpTest, DeepseekV3MatchesUnsplit) {
  // MLA split by heads (q_b, kv_b rows; o_proj columns; q_a, kv_a and the latent cache replicated) and
  // the MoE split within every expert (gate/up rows, down columns), routed + shared in one all-reduce.
  auto world = MpiCommunicator::world();
  if (world->size() < 2) GTEST_SKIP() << "needs mpirun -np 2 (or more)";
  if (4 % world->size() != 0) GTEST_SKIP() << "the fixture's 4 heads do not split over " << world->size();
  compare_tp(std::string(AERIE_SOURCE_DIR) + "/tests/model/fixtures/hf/deepseek_v3", *world,
             {1, 5, 9, 33, 60, 2, 17, 41, 8, 63, 12, 200, 7, 7, 3});
}

// The quantized fixtures (4 heads, intermediate 192, moe_intermediate 32 / 64) at tp 2: FP8 slices that
// start inside a 128-block (q_b's 48 rows, the dense MLP's 96) keep the enclosing block; INT4 down_proj's
// 32 columns per rank are one group.
TEST(TpTest, QuantizedDeepseekFixturesMatchUnsplit) {
  auto world = MpiCommunicator::world();
  if (world->size() != 2) GTEST_SKIP() << "needs mpirun -np 2 (the INT4 fixture's 64 columns split into whole groups of 32)";
  for (const char* name : {"deepseek_v3_fp8", "kimi_k25_int4"}) {
    SCOPED_TRACE(name);
    compare_tp(std::string(AERIE_SOURCE_DIR) + "/tests/model/fixtures/hf/" + name, *world,
               {1, 5, 9, 33, 60, 2, 17, 41, 8, 63, 12, 200, 7});
  }
}

// Expert parallelism (TargetModelOptions::expert_parallel): each rank holds 8 / world whole routed
// experts and computes only their pairs (the attention and the shared expert still split by heads and
// intermediate); the same bounds as tensor parallelism against the unsplit model, on the bf16, FP8 and
// INT4 fixtures (FP8 and INT4 experts loaded whole, no slice of a block or group).
TEST(TpTest, DeepseekExpertParallelMatchesUnsplit) {
  auto world = MpiCommunicator::world();
  if (world->size() < 2) GTEST_SKIP() << "needs mpirun -np 2 (or more)";
  if (8 % world->size() != 0 || 4 % world->size() != 0) GTEST_SKIP() << "8 experts / 4 heads over " << world->size();
  TargetModelOptions ep;
  ep.expert_parallel = true;
  for (const char* name : {"deepseek_v3", "deepseek_v3_fp8", "kimi_k25_int4"}) {
    SCOPED_TRACE(name);
    if (world->size() != 2 && std::string(name) != "deepseek_v3") continue;  // the quantized fixtures' tp 2 slices
    compare_tp(std::string(AERIE_SOURCE_DIR) + "/tests/model/fixtures/hf/" + name, *world,
               {1, 5, 9, 33, 60, 2, 17, 41, 8, 63, 12, 200, 7, 7, 3}, ep);
  }
}

// Random weights (benchmarks, extract --random-weights) are the same model under expert parallelism:
// a rank skipping another rank's experts advances the draws as loading them would (WeightSource::
// skip_linear), so ep 2 equals the unsplit random model (it did not: rank 1's experts were tp 1's 0-3).
TEST(TpTest, RandomWeightsExpertParallelMatchUnsplit) {
  auto world = MpiCommunicator::world();
  if (world->size() != 2) GTEST_SKIP() << "needs mpirun -np 2";
  const TargetConfig cfg = load_target_config(std::string(AERIE_SOURCE_DIR) + "/tests/model/fixtures/hf/deepseek_v3");
  auto self = world->split(world->rank(), 0);
  TargetModelOptions ep;
  ep.expert_parallel = true;
  TargetModel one = TargetModel::random(cfg, *self, {}, 5), split = TargetModel::random(cfg, *world, ep, 5);
  const std::vector<int32_t> ids = {1, 5, 9, 33, 60, 2, 17, 41, 8, 63, 12, 200};
  const int N = static_cast<int>(cfg.num_hidden_layers);
  TargetOutput a = one.forward(ids, nullptr, {0, 2, N}, true), b = split.forward(ids, nullptr, {0, 2, N}, true);
  expect_close_scaled(b.aux_hidden.to_float_vector(), a.aux_hidden.to_float_vector(), 1e-5f, "aux_hidden");
  expect_close_scaled(b.final_hidden.to_float_vector(), a.final_hidden.to_float_vector(), 1e-5f, "final_hidden");
  expect_close_scaled(b.logits.to_float_vector(), a.logits.to_float_vector(), 1e-5f, "logits");
}

// A tp that does not divide the routed experts is refused naming them, before any collective.
TEST(TpTest, ExpertParallelNeedsDivisibleExperts) {
  auto world = MpiCommunicator::world();
  if (world->size() != 3) GTEST_SKIP() << "needs mpirun -np 3 (8 experts over 3 ranks)";
  TargetModelOptions ep;
  ep.expert_parallel = true;
  EXPECT_THROW(TargetModel(std::string(AERIE_SOURCE_DIR) + "/tests/model/fixtures/hf/deepseek_v3", *world, ep), Error);
}

// The micro-batch overlap (TargetModelOptions::tp_overlap): a packed prefill of four sequences of unequal
// lengths at tp = world, with it and without, gives the same aux hidden states, final hidden states and
// logits (all rows, and the last row of each sequence): on Llama 2 with o_proj / down_proj biases (added
// after the all-reduce that the overlap defers), DeepSeek-V3's MLA + sigmoid-routed MoE and Qwen3-MoE's
// softmax-routed MoE. Each row is computed by the same kernels at about half the rows, and OpenBLAS's GEMMs
// at another row count may sum in another order (Haswell's kernels moved an aux value of 6.05 by 3e-5 on
// deepseek_v3): compare_tp's bound, 1e-5 of the tensor's largest magnitude.
TEST(TpTest, MicroBatchOverlapMatchesOneBatch) {
  auto world = MpiCommunicator::world();
  if (world->size() < 2) GTEST_SKIP() << "needs mpirun -np 2 (or more)";
  if (4 % world->size() != 0) GTEST_SKIP() << "the fixtures' 4 heads do not split over " << world->size();
  TargetModelOptions overlap;
  overlap.tp_overlap = true;
  const std::vector<std::vector<int32_t>> seqs = {{1, 5, 9, 33, 60}, {2, 17}, {41, 8, 63, 12, 20, 7, 7, 9}, {3, 4, 5}};
  for (const char* name : {"llama2_linear", "deepseek_v3", "qwen3_moe"}) {
    SCOPED_TRACE(name);
    const std::string dir = std::string(AERIE_SOURCE_DIR) + "/tests/model/fixtures/hf/" + name;
    TargetModel one(dir, *world), two(dir, *world, overlap);
    const int N = static_cast<int>(one.config().num_hidden_layers);
    for (TargetModel::Logits logits : {TargetModel::Logits::All, TargetModel::Logits::Last}) {
      TargetOutput a = one.forward_batch(seqs, {}, {0, 1, N}, logits);
      TargetOutput b = two.forward_batch(seqs, {}, {0, 1, N}, logits);
      expect_close_scaled(b.aux_hidden.to_float_vector(), a.aux_hidden.to_float_vector(), 1e-5f, "aux_hidden");
      expect_close_scaled(b.final_hidden.to_float_vector(), a.final_hidden.to_float_vector(), 1e-5f, "final_hidden");
      ASSERT_EQ(b.logits.shape(), a.logits.shape());
      expect_close_scaled(b.logits.to_float_vector(), a.logits.to_float_vector(), 1e-5f, "logits");
    }
  }
}

TEST(TpTest, RejectsIndivisibleSplits) {
  auto world = MpiCommunicator::world();
  if (world->size() < 2) GTEST_SKIP() << "needs mpirun -np 2 (or more)";
  testing::TinyLlama m;
  m.n_heads = 4 * world->size() - 1;  // not divisible by the world size (nor is 1 kv head)
  m.n_kv = 1;
  std::string dir = shared_scratch(*world, "llama_tp_indivisible");
  if (world->rank() == 0) testing::write_tiny_llama(dir, m);
  world->barrier();
  EXPECT_THROW(TargetModel(dir, *world), Error);  // thrown before any collective: no rank hangs
}

}  // namespace
}  // namespace aerie
