// Embedding lookup from F32 and BF16 tables, with a vocabulary-shard row offset, and id range errors.
#include "kernels/embedding.h"

#include "kernel_test_util.h"

namespace aerie {
namespace {

TEST(Embedding, LooksUpRowsOfF32AndBf16Tables) {
  const int64_t v = 6, h = 5;
  Tensor table = testing::random_tensor({v, h}, 1);
  Tensor ids = Tensor::from_vector<int32_t>({3, 0, 5, 3}, {4});
  for (DType dt : {DType::F32, DType::BF16}) {
    Tensor t = table.to(dt);
    const auto tv = t.to_float_vector();  // bf16-rounded values when BF16: the lookup is exact
    Tensor out = Tensor::empty({4, h}, DType::F32);
    embedding_forward(ids, t, out);
    std::vector<float> ref;
    for (int id : {3, 0, 5, 3}) ref.insert(ref.end(), tv.begin() + id * h, tv.begin() + (id + 1) * h);
    EXPECT_EQ(out.to_float_vector(), ref) << dtype_name(dt);
  }
}

TEST(Embedding, RowOffsetSelectsTheShard) {
  Tensor table = Tensor::from_vector<float>({10, 11, 20, 21}, {2, 2});  // rows for ids 100, 101
  Tensor ids = Tensor::from_vector<int32_t>({101, 100}, {2});
  Tensor out = Tensor::empty({2, 2}, DType::F32);
  embedding_forward(ids, table, out, 100);
  EXPECT_EQ(out.to_float_vector(), (std::vector<float>{20, 21, 10, 11}));
}

TEST(Embedding, ErrorsNameTheIdAndTensor) {
  Tensor table = testing::random_tensor({4, 3}, 1);
  Tensor out = Tensor::empty({2, 3}, DType::F32);
  Tensor ids = Tensor::from_vector<int32_t>({1, 4}, {2});
  testing::expect_error([&] { embedding_forward(ids, table, out); }, "ids[1] = 4");
  Tensor neg = Tensor::from_vector<int32_t>({1, 2}, {2});
  testing::expect_error([&] { embedding_forward(neg, table, out, 2); }, "ids[0] = 1");
  Tensor out_bad = Tensor::empty({2, 4}, DType::F32);
  Tensor ok = Tensor::from_vector<int32_t>({1, 2}, {2});
  testing::expect_error([&] { embedding_forward(ok, table, out_bad); }, "embedding_forward: out");
  Tensor ids64 = Tensor::from_vector<int64_t>({1, 2}, {2});
  testing::expect_error([&] { embedding_forward(ids64, table, out); }, "embedding_forward: ids");
}

}  // namespace
}  // namespace aerie
