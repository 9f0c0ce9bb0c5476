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

// embedding_forward_in_range: the same rows as embedding_forward within the bound; the bound itself is
// checked against the table (and, on the CPU, the ids against the bound).
TEST(Embedding, InRangeGatherIsTheLookupBelowItsBound) {
  Tensor table = testing::random_tensor({6, 3}, 3);
  Tensor ids = Tensor::from_vector<int32_t>({2, 0, 3, 3}, {4});
  Tensor out = Tensor::empty({4, 3}, DType::F32), ref = Tensor::empty({4, 3}, DType::F32);
  embedding_forward_in_range(ids, table, out, 4);
  embedding_forward(ids, table, ref);
  EXPECT_EQ(out.to_float_vector(), ref.to_float_vector());
  testing::expect_error([&] { embedding_forward_in_range(ids, table, out, 7); }, "id bound 7");
  testing::expect_error([&] { embedding_forward_in_range(ids, table, out, 0); }, "id bound 0");
  testing::expect_error([&] { embedding_forward_in_range(ids, table, out, 3); }, "ids[2] = 3");
}

TEST(Embedding, Bf16OutputIsTheRoundedRow) {
  Tensor table = testing::random_tensor({3, 4}, 2);
  Tensor ids = Tensor::from_vector<int32_t>({2, 2, 0}, {3});
  Tensor out = Tensor::empty({3, 4}, DType::BF16), ref = Tensor::empty({3, 4}, DType::F32);
  embedding_forward(ids, table, out);
  embedding_forward(ids, table, ref);
  EXPECT_EQ(out.to_float_vector(), ref.to(DType::BF16).to_float_vector());
}

// The backward by hand: repeated ids add up, other rows keep their values, BF16 dout is widened.
TEST(Embedding, BackwardAddsRowsPerId) {
  const int64_t h = 2;
  Tensor ids = Tensor::from_vector<int32_t>({12, 10, 12, 12}, {4});  // row offset 10: rows 2, 0, 2, 2
  Tensor dout = Tensor::from_vector<float>({1, 2, 3, 4, 0.5f, 0.25f, -1, 8}, {4, h});
  Tensor dtable = Tensor::from_vector<float>({100, 200, 300, 400, 500, 600}, {3, h});
  embedding_backward(ids, dout, dtable, 10);
  EXPECT_EQ(dtable.to_float_vector(), (std::vector<float>{103, 204, 300, 400, 500.5f, 610.25f}));
  Tensor dout_bf = dout.to(DType::BF16);  // these values are exact in bf16
  embedding_backward(ids, dout_bf, dtable, 10);
  EXPECT_EQ(dtable.to_float_vector(), (std::vector<float>{106, 208, 300, 400, 501, 620.5f}));
}

// The backward is the adjoint of the forward: <forward(table), R> has gradient backward(R) wrt table.
TEST(Embedding, BackwardMatchesFiniteDifferences) {
  Tensor table = testing::random_tensor({5, 3}, 3);
  Tensor ids = Tensor::from_vector<int32_t>({4, 1, 4, 0}, {4});
  Tensor r = testing::random_tensor({4, 3}, 4);
  Tensor out = Tensor::empty({4, 3}, DType::F32);
  auto loss = [&] {
    embedding_forward(ids, table, out);
    return testing::dot_double(out, r);
  };
  const auto g = testing::numeric_grad(table, loss);
  Tensor dtable = Tensor::zeros({5, 3}, DType::F32);
  embedding_backward(ids, r, dtable);
  testing::expect_close(dtable.to_float_vector(), g, testing::kFdAtol, testing::kFdRtol, "dtable");
}

TEST(Embedding, BackwardErrorsNameTheIdAndTensor) {
  Tensor dtable = Tensor::zeros({4, 3}, DType::F32), dout = Tensor::zeros({2, 3}, DType::F32);
  Tensor ids = Tensor::from_vector<int32_t>({1, 4}, {2});
  testing::expect_error([&] { embedding_backward(ids, dout, dtable); }, "ids[1] = 4");
  Tensor ok = Tensor::from_vector<int32_t>({1, 2}, {2});
  Tensor dtable_bf = Tensor::zeros({4, 3}, DType::BF16);
  testing::expect_error([&] { embedding_backward(ok, dout, dtable_bf); }, "embedding_backward: dtable");
  Tensor dout_bad = Tensor::zeros({2, 4}, DType::F32);
  testing::expect_error([&] { embedding_backward(ok, dout_bad, dtable); }, "embedding_backward: dout");
}

}  // namespace
}  // namespace aerie
