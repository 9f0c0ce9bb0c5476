// Sampling (model/sampling.h): greedy at temperature 0, the nucleus of top-p, seeded determinism, the
// empirical distribution of draws, and sample_generate against greedy_generate on stories260K.
#include <gtest/gtest.h>

#include <cmath>
#include <numeric>
#include <set>

#include "comm/communicator.h"
#include "model/target.h"
#include "model/sampling.h"
#include "test_util.h"

namespace aerie {
namespace {

std::vector<double> softmax(const std::vector<float>& x, double t) {
  double mx = -INFINITY, s = 0;
  for (float v : x) mx = std::max(mx, v / t);
  std::vector<double> p;
  for (float v : x) s += std::exp(v / t - mx), p.push_back(std::exp(v / t - mx));
  for (double& v : p) v /= s;
  return p;
}

TEST(Sampling, TemperatureZeroIsArgmaxAndDrawsNothing) {
  std::vector<float> logits = {0.5f, 3.0f, -1.0f, 3.0f, 2.9f};
  SampleRng rng(7), untouched(7);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(sample_token(logits.data(), 5, {0.0, 0.9}, rng), 1);  // tie: smaller id
  EXPECT_EQ(rng.next(), untouched.next()) << "greedy must not consume random numbers";
  std::vector<double> d = sampling_distribution(logits.data(), 5, {0.0, 1.0});
  EXPECT_EQ(d, (std::vector<double>{0, 1, 0, 0, 0}));
}

TEST(Sampling, TopPKeepsTheSmallestSetReachingTheMass) {
  std::vector<float> logits = {1.0f, 2.0f, 0.0f, 3.0f, -2.0f, 2.5f};
  const double T = 0.8;
  std::vector<double> p = softmax(logits, T);
  for (double top_p : {0.05, 0.3, 0.5, 0.7, 0.9, 0.99, 1.0}) {
    std::vector<double> d = sampling_distribution(logits.data(), 6, {T, top_p});
    EXPECT_NEAR(std::accumulate(d.begin(), d.end(), 0.0), 1.0, 1e-12);
    // The kept tokens are the most probable ones, their original mass reaches top_p, and without the
    // least probable kept token it would not.
    double kept = 0, least = 1;
    for (int i = 0; i < 6; ++i) {
      if (d[i] > 0) kept += p[i], least = std::min(least, p[i]);
      for (int j = 0; j < 6; ++j)
        if (d[i] == 0 && d[j] > 0) {
          EXPECT_LE(p[i], p[j]) << "top_p " << top_p;
        }
    }
    EXPECT_GE(kept + 1e-12, top_p) << "top_p " << top_p;
    EXPECT_LT(kept - least, top_p) << "top_p " << top_p;
    for (int i = 0; i < 6; ++i)
      if (d[i] > 0) {
        EXPECT_NEAR(d[i], p[i] / kept, 1e-12);  // renormalised
      }
  }
  // top_p 0.05 keeps only the argmax: sampling is then greedy.
  SampleRng rng(1);
  for (int i = 0; i < 20; ++i) EXPECT_EQ(sample_token(logits.data(), 6, {T, 0.05}, rng), 3);
}

TEST(Sampling, SeededDrawsAreDeterministicAndFollowTheDistribution) {
  std::vector<float> logits = {0.1f, 1.2f, -0.3f, 0.8f, 0.0f, 2.0f, -1.5f, 0.4f};
  const SamplingParams sp{1.3, 0.85};
  std::vector<double> d = sampling_distribution(logits.data(), 8, sp);
  auto draw = [&](uint64_t seed, int n) {
    SampleRng rng(seed);
    std::vector<int32_t> out;
    for (int i = 0; i < n; ++i) out.push_back(sample_token(logits.data(), 8, sp, rng));
    return out;
  };
  EXPECT_EQ(draw(42, 200), draw(42, 200));
  EXPECT_NE(draw(42, 200), draw(43, 200));
  const int n = 40000;
  std::vector<int32_t> xs = draw(5, n);
  std::vector<double> freq(8, 0.0);
  for (int32_t x : xs) freq[x] += 1.0 / n;
  for (int i = 0; i < 8; ++i) {
    if (d[i] == 0) {
      EXPECT_EQ(freq[i], 0.0) << "token " << i << " is outside the nucleus";
    }
    // 5 standard deviations of a binomial frequency: fails by chance with probability < 1e-6.
    EXPECT_NEAR(freq[i], d[i], 5 * std::sqrt(d[i] * (1 - d[i]) / n) + 1e-9) << "token " << i;
  }
  // Sequence seeds: distinct per index, and a pure function of (seed, index).
  std::set<uint64_t> seeds;
  for (uint64_t i = 0; i < 1000; ++i) seeds.insert(sequence_seed(3, i));
  EXPECT_EQ(seeds.size(), 1000u);
  EXPECT_EQ(sequence_seed(3, 17), sequence_seed(3, 17));
  EXPECT_NE(sequence_seed(3, 17), sequence_seed(4, 17));
  // The RNG is platform independent: its first outputs are those of splitmix64.
  SampleRng r(0);
  EXPECT_EQ(r.next(), 0xE220A8397B1DCDAFull);
}

TEST(Sampling, RejectsInvalidParams) {
  std::vector<float> logits = {1.0f, 2.0f};
  SampleRng rng(0);
  EXPECT_NE(testing::error_of([&] { sample_token(logits.data(), 2, {-0.1, 1.0}, rng); }).find("temperature"),
            std::string::npos);
  EXPECT_NE(testing::error_of([&] { sample_token(logits.data(), 2, {1.0, 0.0}, rng); }).find("top-p"),
            std::string::npos);
  EXPECT_NE(testing::error_of([&] { sample_token(logits.data(), 2, {1.0, 1.5}, rng); }).find("top-p"),
            std::string::npos);
}

TEST(Sampling, GenerateGreedyEqualsGreedyGenerateAndSamplingIsSeeded) {
  AERIE_REQUIRE_MODEL();
  auto world = MpiCommunicator::world();
  auto self = world->split(world->rank(), 0);
  TargetModel model(testing::model_dir(), *self);
  const std::vector<int32_t> prompt = {1, 403, 407, 261, 378};
  const std::vector<int32_t> stop = {1, 2};
  std::vector<int32_t> greedy = greedy_generate(model, prompt, 60, stop);
  SampleRng rng(0);
  std::vector<int32_t> got = sample_generate(model, prompt, 60, stop, {0.0, 1.0}, rng);
  EXPECT_EQ(got, std::vector<int32_t>(greedy.begin() + static_cast<int64_t>(prompt.size()), greedy.end()));

  auto sampled = [&](uint64_t seed) {
    SampleRng r(seed);
    return sample_generate(model, prompt, 60, stop, {1.0, 0.95}, r);
  };
  std::vector<int32_t> a = sampled(11), b = sampled(11), c = sampled(12);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  EXPECT_LE(a.size(), 60u);
  for (size_t i = 0; i + 1 < a.size(); ++i) EXPECT_TRUE(a[i] != 1 && a[i] != 2) << "generation went past a stop id";
}

}  // namespace
}  // namespace aerie
