// TargetModel::forward_tree (tree verification of speculative decoding) against forward() of each
// root-to-node path, on the Hugging Face family fixtures (Llama 3 tied, Llama 2 with biases, Qwen2
// biases, Qwen3 q/k norm; Mistral's sliding window within and past its 8 positions), and
// KVCache::keep_rows: a cache kept to one accepted path continues as the path's own cache. CPU always;
// CUDA F32 after AERIE_REQUIRE_CUDA(). Tolerances: F32 against F32 with other summation orders (the
// prefix and the path keys merged by log-sum-exp): atol 1e-4 / rtol 1e-4, as tests/model/target_batch_test.cc.
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "core/device.h"
#include "model/target.h"
#include "model_testing.h"
#include "test_util.h"

namespace aerie {
namespace {

using testing::hf_fixture;
using testing::self_comm;
using testing::some_ids;

constexpr float kAtol = 1e-4f, kRtol = 1e-4f;

/// A prefix of P ids, then a tree of 8 rows (depths 0, 1, 1, 1, 2, 2, 3, 3; row 6's parent 4, row 7's 5):
/// each row's logits and aux hidden states vs the last row of forward() of prefix + its path; then the
/// cache kept to the path of row 6 continues with one id as forward() of the whole sequence.
void check_tree(TargetModel& m, int64_t P, const std::string& what) {
  const int64_t V = m.config().vocab_size;
  const std::vector<int32_t> prefix = some_ids(P, V, 11), ids = some_ids(8, V, 12);
  const std::vector<int32_t> parent = {-1, 0, 0, 0, 1, 3, 4, 5};
  const std::vector<int> aux = {0, 1, static_cast<int>(m.config().num_hidden_layers)};
  KVCache cache = m.make_cache(P + 8 + 1);
  m.forward(prefix, &cache, {}, false);
  TargetOutput t = m.forward_tree(ids, parent, &cache, aux, true);
  ASSERT_EQ(t.logits.dim(0), 8) << what;
  EXPECT_EQ(cache.length(), P + 8);
  auto path_of = [&](int32_t row) {
    std::vector<int32_t> path;
    for (int32_t r = row; r >= 0; r = parent[r]) path.insert(path.begin(), ids[r]);
    std::vector<int32_t> seq = prefix;
    seq.insert(seq.end(), path.begin(), path.end());
    return seq;
  };
  for (int32_t row = 0; row < 8; ++row) {
    const std::vector<int32_t> seq = path_of(row);
    const int64_t L = static_cast<int64_t>(seq.size());
    TargetOutput one = m.forward(seq, nullptr, aux, true);
    const std::string w = what + " row " + std::to_string(row);
    testing::expect_close(t.logits.slice(row, row + 1).to_float_vector(), one.logits.slice(L - 1, L).to_float_vector(),
                          kAtol, kRtol, w + " logits");
    testing::expect_close(t.aux_hidden.slice(row, row + 1).to_float_vector(),
                          one.aux_hidden.slice(L - 1, L).to_float_vector(), kAtol, kRtol, w + " aux");
  }
  // Keep the path 0 -> 1 -> 4 -> 6 and continue: the cache is the path's own.
  cache.keep_rows(P, {0, 1, 4, 6});
  EXPECT_EQ(cache.length(), P + 4);
  std::vector<int32_t> seq = path_of(6);
  seq.push_back(5);
  TargetOutput next = m.forward({5}, &cache, {}, true), whole = m.forward(seq, nullptr, {}, true);
  const int64_t L = static_cast<int64_t>(seq.size());
  testing::expect_close(next.logits.to_float_vector(), whole.logits.slice(L - 1, L).to_float_vector(), kAtol, kRtol,
                        what + " after keep_rows");
}

TEST(TargetTree, RowsEqualTheirPathsCpu) {
  auto self = self_comm();
  for (const std::string name : {"llama3_tied", "llama2_linear", "qwen2", "qwen3"}) {
    TargetModel m(hf_fixture(name), *self);
    check_tree(m, 5, name);
  }
  // Mistral's sliding window of 8: a tree that ends inside it works; past it the tree is refused.
  TargetModel m(hf_fixture("mistral_swa"), *self);
  check_tree(m, 1, "mistral_swa inside its window");  // 1 + 8 rows, deepest at position 4
  KVCache c = m.make_cache(20);
  m.forward(some_ids(7, m.config().vocab_size, 3), &c, {}, false);  // the children at position 8
  EXPECT_NE(testing::error_of([&] { m.forward_tree({1, 2, 3}, {-1, 0, 0}, &c, {}, true); }).find("sliding window"),
            std::string::npos);
}

TEST(TargetTree, RejectsMalformedTrees) {
  auto self = self_comm();
  TargetModel m(hf_fixture("llama3_tied"), *self);
  KVCache c = m.make_cache(16), empty = m.make_cache(16);
  m.forward({1, 2, 3}, &c, {}, false);
  auto err = [&](const std::vector<int32_t>& parent, KVCache* cache) {
    std::vector<int32_t> ids(parent.size(), 4);
    return testing::error_of([&] { m.forward_tree(ids, parent, cache, {}, true); });
  };
  EXPECT_NE(err({0, 0}, &c).find("row 0's parent"), std::string::npos);
  EXPECT_NE(err({-1, 1}, &c).find("row 1's parent 1"), std::string::npos);
  EXPECT_NE(err({-1, 0, 1, 0}, &c).find("breadth-first"), std::string::npos);
  EXPECT_NE(err({-1, 0}, nullptr).find("cached prefix"), std::string::npos);
  EXPECT_NE(err({-1, 0}, &empty).find("cached prefix"), std::string::npos);
  EXPECT_NE(testing::error_of([&] { m.forward_tree({4, 4}, {-1}, &c, {}, true); }).find("1 parents for 2"),
            std::string::npos);
  EXPECT_EQ(c.length(), 3);  // checks run before anything is written
  EXPECT_NE(testing::error_of([&] { c.keep_rows(0, {0, 2, 1}); }).find("not ascending"), std::string::npos);
  EXPECT_NE(testing::error_of([&] { c.keep_rows(1, {0, 5}); }).find("past the cache"), std::string::npos);
}

TEST(TargetTreeCuda, F32RowsEqualTheirPaths) {
  AERIE_REQUIRE_CUDA();
  auto self = self_comm();
  for (const std::string name : {"llama3_tied", "qwen3"}) {
    TargetModel m(hf_fixture(name), *self, {Device::CUDA, DType::F32});
    check_tree(m, 5, name + " cuda f32");
  }
}

}  // namespace
}  // namespace aerie
