// RoPE on CUDA against the CPU reference (kernels/cpu/rope.cc): default, linear and llama3 inv_freq,
// forward and inverse, F32 and BF16, odd head counts and lengths, positions up to 131071.
// Skipped without a GPU.
#include <random>

#include "cuda_test_util.h"
#include "kernels/rope.h"

namespace aerie {
namespace {

using testing::expect_close_as;
using testing::gpu;
using testing::random_as;

RopeParams params_of(const std::string& type) {
  RopeParams p;
  p.theta = 500000.0;
  p.type = type;
  if (type == "linear") p.factor = 4.0;
  if (type == "llama3") {
    p.factor = 8.0;
    p.low_freq_factor = 1.0;
    p.high_freq_factor = 4.0;
    p.original_max_position_embeddings = 8192;
  }
  return p;
}

Tensor random_positions(int64_t t, uint32_t seed, int32_t max_pos) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int32_t> dist(0, max_pos);
  std::vector<int32_t> v(static_cast<size_t>(t));
  for (auto& p : v) p = dist(gen);
  return Tensor::from_vector(v, {t});
}

TEST(RopeCuda, MatchesCpu) {
  AERIE_REQUIRE_CUDA();
  struct Case {
    int64_t t, nh, d;
  };
  for (const Case c : {Case{1, 1, 2}, Case{7, 3, 64}, Case{33, 5, 128}, Case{129, 32, 128}, Case{2, 1, 1024}})
    for (const char* type : {"default", "linear", "llama3"})
      for (DType dt : {DType::F32, DType::BF16})
        for (bool inverse : {false, true}) {
          const std::string what = std::string(type) + " T " + std::to_string(c.t) + " nh " + std::to_string(c.nh) +
                                   " d " + std::to_string(c.d) + " " + dtype_name(dt) + (inverse ? " inverse" : "");
          const auto inv = rope_inv_freq(params_of(type), c.d);
          Tensor x = random_as({c.t, c.nh, c.d}, dt, 11, -2.0f, 2.0f);
          Tensor pos = random_positions(c.t, 12, c.t == 33 ? 131071 : 8191);
          Tensor xg = gpu(x), pg = gpu(pos);
          rope_apply(x, pos, inv, inverse);
          rope_apply(xg, pg, inv, inverse);
          // Angles up to 131071 rad: cosf/sinf of CUDA and glibc may differ by an ulp or two, which
          // is ~1e-7 absolute on values of magnitude 2, well inside the F32 tolerance.
          expect_close_as(xg, x, dt, what);
        }
}

// Several heads go through the one-block-per-row kernel (the row's angles once), one head through the
// one-thread-per-pair kernel: the same values bit for bit (the same cosf/sinf and products).
TEST(RopeCuda, RowKernelEqualsThePairKernel) {
  AERIE_REQUIRE_CUDA();
  const int64_t t = 37, nh = 32, d = 128;
  const auto inv = rope_inv_freq(params_of("llama3"), d);
  const Tensor pos = random_positions(t, 15, 8191);
  std::vector<int32_t> each(static_cast<size_t>(t * nh));
  for (int64_t i = 0; i < t * nh; ++i) each[static_cast<size_t>(i)] = pos.data<int32_t>()[i / nh];
  for (DType dt : {DType::F32, DType::BF16})
    for (bool inverse : {false, true}) {
      const Tensor x = random_as({t, nh, d}, dt, 16, -2.0f, 2.0f);
      Tensor rows = gpu(x), pairs = gpu(x).reshape({t * nh, 1, d});
      rope_apply(rows, gpu(pos), inv, inverse);
      rope_apply(pairs, gpu(Tensor::from_vector(each, {t * nh})), inv, inverse);
      EXPECT_EQ(rows.to_float_vector(), pairs.to_float_vector()) << dtype_name(dt) << (inverse ? " inverse" : "");
    }
}

TEST(RopeCuda, InverseUndoesForward) {
  AERIE_REQUIRE_CUDA();
  const auto inv = rope_inv_freq(params_of("llama3"), 128);
  Tensor x = random_as({17, 4, 128}, DType::F32, 13);
  Tensor xg = gpu(x), pg = gpu(random_positions(17, 14, 4095));
  rope_apply(xg, pg, inv, false);
  rope_apply(xg, pg, inv, true);
  // cos^2 + sin^2 = 1 up to a few fp32 ulp
  testing::expect_close(xg.to_float_vector(), x.to_float_vector(), 1e-6f, 1e-5f, "round trip");
}

TEST(RopeCuda, HeadDimAboveKernelLimitThrows) {
  AERIE_REQUIRE_CUDA();
  Tensor xg = Tensor::zeros({1, 1, 1026}, DType::F32, Device::CUDA);
  Tensor pg = Tensor::zeros({1}, DType::I32, Device::CUDA);
  testing::expect_error([&] { rope_apply(xg, pg, std::vector<float>(513, 1.0f)); }, "head_dim 1026");
}

TEST(RopeCuda, InterleavedMatchesCpu) {
  AERIE_REQUIRE_CUDA();
  RopeParams p;
  p.theta = 50000.0;
  p.type = "yarn";
  p.factor = 64.0;
  p.original_max_position_embeddings = 4096;
  for (int64_t d : {int64_t{2}, int64_t{64}, int64_t{128}})
    for (DType dt : {DType::F32, DType::BF16}) {
      const std::string what = "interleaved d " + std::to_string(d) + " " + dtype_name(dt);
      const auto inv = rope_inv_freq(p, d);
      Tensor x = random_as({37, 5, d}, dt, 21, -2.0f, 2.0f);
      Tensor pos = random_positions(37, 22, 262143);
      Tensor xg = gpu(x), pg = gpu(pos);
      rope_apply_interleaved(x, pos, inv, 1.25f);
      rope_apply_interleaved(xg, pg, inv, 1.25f);
      expect_close_as(xg, x, dt, what);
    }
}

}  // namespace
}  // namespace aerie
