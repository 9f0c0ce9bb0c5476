// Embedding lookup and backward on CUDA against the CPU reference (kernels/cpu/embedding.cc): F32/BF16
// tables and outputs, repeated ids (atomic accumulation), a row offset, id range errors. Skipped
// without a GPU.
#include <random>

#include "cuda_test_util.h"
#include "kernels/embedding.h"

namespace aerie {
namespace {

using testing::gpu;
using testing::random_as;

Tensor random_ids(int64_t n, int32_t lo, int32_t hi, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int32_t> dist(lo, hi);
  std::vector<int32_t> v(static_cast<size_t>(n));
  for (auto& x : v) x = dist(gen);
  return Tensor::from_vector(v, {n});
}

struct Case {
  int64_t n, v, h;
};
const Case kCases[] = {{1, 1, 1}, {7, 5, 33}, {300, 1000, 96}, {64, 3000, 4096}, {513, 3, 17}};

TEST(EmbeddingCuda, ForwardMatchesCpu) {
  AERIE_REQUIRE_CUDA();
  for (const Case& c : kCases)
    for (DType tt : {DType::F32, DType::BF16})
      for (DType ot : {DType::F32, DType::BF16}) {
        const std::string what = "N " + std::to_string(c.n) + " V " + std::to_string(c.v) + " H " +
                                 std::to_string(c.h) + " " + dtype_name(tt) + " -> " + dtype_name(ot);
        const int64_t offset = 100;
        Tensor table = random_as({c.v, c.h}, tt, 31);
        Tensor ids = random_ids(c.n, offset, offset + static_cast<int32_t>(c.v) - 1, 32);
        Tensor out = Tensor::empty({c.n, c.h}, ot);
        embedding_forward(ids, table, out, offset);
        Tensor og = Tensor::empty({c.n, c.h}, ot, Device::CUDA);
        embedding_forward(gpu(ids), gpu(table), og, offset);
        EXPECT_EQ(og.to_float_vector(), out.to_float_vector()) << what;  // a copy with one rounding: exact
      }
}

TEST(EmbeddingCuda, InRangeGatherMatchesCpu) {
  AERIE_REQUIRE_CUDA();
  for (const Case& c : kCases)
    for (DType tt : {DType::F32, DType::BF16}) {
      Tensor table = random_as({c.v, c.h}, tt, 33);
      Tensor ids = random_ids(c.n, 0, static_cast<int32_t>(c.v) - 1, 34);
      Tensor out = Tensor::empty({c.n, c.h}, tt);
      embedding_forward(ids, table, out);
      Tensor og = Tensor::empty({c.n, c.h}, tt, Device::CUDA);
      embedding_forward_in_range(gpu(ids), gpu(table), og, c.v);
      EXPECT_EQ(og.to_float_vector(), out.to_float_vector()) << "N " << c.n << " V " << c.v << " H " << c.h;
    }
}

TEST(EmbeddingCuda, BackwardMatchesCpu) {
  AERIE_REQUIRE_CUDA();
  for (const Case& c : kCases)
    for (DType dt : {DType::F32, DType::BF16}) {
      const std::string what = "N " + std::to_string(c.n) + " V " + std::to_string(c.v) + " H " +
                               std::to_string(c.h) + " dout " + dtype_name(dt);
      Tensor ids = random_ids(c.n, 0, static_cast<int32_t>(c.v) - 1, 33);  // repeats when N > V
      Tensor dout = random_as({c.n, c.h}, dt, 34);
      Tensor dtable0 = testing::random_tensor({c.v, c.h}, 35);  // added to
      Tensor dtable = dtable0.clone();
      embedding_backward(ids, dout, dtable);
      Tensor dtg = gpu(dtable0);
      embedding_backward(gpu(ids), gpu(dout), dtg);
      // Repeated ids are summed in atomic (arbitrary) order on the GPU: fp32 order effects only.
      testing::expect_close(dtg.to_float_vector(), dtable.to_float_vector(), 1e-5f, 1e-5f, what);
    }
}

TEST(EmbeddingCuda, IdOutOfRangeThrows) {
  AERIE_REQUIRE_CUDA();
  Tensor table = Tensor::zeros({4, 3}, DType::F32, Device::CUDA);
  Tensor out = Tensor::empty({2, 3}, DType::F32, Device::CUDA);
  Tensor ids = gpu(Tensor::from_vector<int32_t>({1, 4}, {2}));
  testing::expect_error([&] { embedding_forward(ids, table, out); }, "ids[1] = 4");
  testing::expect_error([&] { embedding_backward(ids, out, table); }, "ids[1] = 4");
}

}  // namespace
}  // namespace aerie
