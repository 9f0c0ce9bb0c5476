// TargetModel::forward_batch against forward() of each sequence alone, on the Hugging Face family
// fixtures (Llama 3 tied, Llama 2 with biases, Mistral sliding window 8, Qwen2 biases, Qwen3 q/k norm):
// a packed prefill without caches, a continuation of caches of different lengths (one sequence without
// a cache), batched one-token decoding with last-row logits, and the errors. CPU always; the same on
// CUDA (F32 and BF16 modes) after AERIE_REQUIRE_CUDA().
//
// Tolerances: F32 batch vs F32 single is the same arithmetic up to fp32 summation order (the GEMMs see
// more rows, the packed attention another loop order): atol 1e-4 / rtol 1e-4 as the other F32 model
// tests (values O(1..10); measured differences ~1e-6). BF16 batch vs BF16 single (CUDA): the same bf16
// rounding points, different fp32 summation orders, so an element can differ by a flipped bf16 rounding
// that propagates: relative L2 below 2e-2, as tests/model/target_cuda_test.cc's BF16 CUDA vs CPU bound.
#include <cmath>
#include <random>

#include "comm/communicator.h"
#include "core/device.h"
#include "model/blocks.h"
#include "model/target.h"
#include "model/target_impl.h"
#include "model_testing.h"
#include "test_util.h"

namespace aerie {
namespace {

using testing::self_comm;
using testing::hf_fixture;
using testing::some_ids;
using testing::rel_l2;

constexpr float kAtol = 1e-4f, kRtol = 1e-4f;
constexpr double kBf16RelL2 = 2e-2;
const std::vector<std::string> kFamilies = {"llama3_tied", "llama2_linear", "mistral_swa", "qwen2", "qwen3"};

std::vector<int> all_layers(const TargetModel& m) {
  std::vector<int> aux;
  for (int k = 0; k <= m.config().num_hidden_layers; ++k) aux.push_back(k);
  return aux;
}

/// `got` rows [r0, r0 + ref rows) against `ref`: elementwise (bf16 == false) or relative L2 (bf16).
void expect_rows(const Tensor& got, int64_t r0, const Tensor& ref, bool bf16, const std::string& what) {
  ASSERT_TRUE(got.defined() && ref.defined()) << what;
  ASSERT_EQ(got.dim(1), ref.dim(1)) << what;
  std::vector<float> g = got.slice(r0, r0 + ref.dim(0)).to_float_vector(), r = ref.to_float_vector();
  if (bf16) {
    for (float x : g) ASSERT_TRUE(std::isfinite(x)) << what;
    EXPECT_LE(rel_l2(g, r), kBf16RelL2) << what;
  } else {
    testing::expect_close(g, r, kAtol, kRtol, what);
  }
}

/// Packed prefill of 3 sequences (lengths 13, 1, 10: over Mistral's window 8) vs forward() of each.
void check_prefill(TargetModel& m, bool bf16, const std::string& what) {
  const int64_t V = m.config().vocab_size;
  std::vector<std::vector<int32_t>> seqs = {some_ids(13, V, 1), some_ids(1, V, 2), some_ids(10, V, 3)};
  const std::vector<int> aux = {0, 1, static_cast<int>(m.config().num_hidden_layers)};
  TargetOutput all = m.forward_batch(seqs, {}, aux, TargetModel::Logits::All);
  TargetOutput last = m.forward_batch(seqs, {}, aux, TargetModel::Logits::Last);
  TargetOutput none = m.forward_batch(seqs, {}, {}, TargetModel::Logits::None);
  ASSERT_EQ(all.aux_hidden.dim(0), 24);
  ASSERT_EQ(last.logits.dim(0), 3);
  EXPECT_FALSE(none.logits.defined());
  EXPECT_FALSE(none.aux_hidden.defined());
  EXPECT_EQ(all.logits.dtype(), DType::F32);
  int64_t r0 = 0;
  for (size_t b = 0; b < seqs.size(); ++b) {
    const std::string w = what + " prefill seq " + std::to_string(b);
    TargetOutput one = m.forward(seqs[b], nullptr, aux, true);
    const int64_t n = one.final_hidden.dim(0);
    expect_rows(all.aux_hidden, r0, one.aux_hidden, bf16, w + " aux");
    expect_rows(all.final_hidden, r0, one.final_hidden, bf16, w + " z");
    expect_rows(none.final_hidden, r0, one.final_hidden, bf16, w + " z (no logits)");
    expect_rows(all.logits, r0, one.logits, bf16, w + " logits");
    expect_rows(last.logits, static_cast<int64_t>(b), one.logits.slice(n - 1, n), bf16, w + " last logits");
    r0 += n;
  }
}

/// Caches of lengths 6, 0 and none (sequence 1 has no cache) continued by 4, 2, 9 ids in one batch, then
/// three one-token decoding steps of the two cached sequences: each vs forward() of the whole sequence.
void check_caches(TargetModel& m, bool bf16, const std::string& what) {
  const int64_t V = m.config().vocab_size;
  std::vector<int32_t> a = some_ids(13, V, 4), c = some_ids(5, V, 5), nb = some_ids(9, V, 6);
  KVCache ca = m.make_cache(13), cc = m.make_cache(5);
  m.forward(std::vector<int32_t>(a.begin(), a.begin() + 6), &ca, {}, false);
  TargetOutput out = m.forward_batch({std::vector<int32_t>(a.begin() + 6, a.begin() + 10), nb,
                                      std::vector<int32_t>(c.begin(), c.begin() + 2)},
                                     {&ca, nullptr, &cc}, all_layers(m), TargetModel::Logits::All);
  EXPECT_EQ(ca.length(), 10);
  EXPECT_EQ(cc.length(), 2);
  ASSERT_EQ(out.final_hidden.dim(0), 15);
  TargetOutput fa = m.forward(a, nullptr, all_layers(m), true), fb = m.forward(nb, nullptr, all_layers(m), true),
               fc = m.forward(c, nullptr, all_layers(m), true);
  expect_rows(out.aux_hidden, 0, fa.aux_hidden.slice(6, 10), bf16, what + " cached seq 0 aux");
  expect_rows(out.logits, 0, fa.logits.slice(6, 10), bf16, what + " cached seq 0 logits");
  expect_rows(out.aux_hidden, 4, fb.aux_hidden, bf16, what + " uncached seq 1 aux");
  expect_rows(out.logits, 4, fb.logits, bf16, what + " uncached seq 1 logits");
  expect_rows(out.final_hidden, 13, fc.final_hidden.slice(0, 2), bf16, what + " cached seq 2 z");
  expect_rows(out.logits, 13, fc.logits.slice(0, 2), bf16, what + " cached seq 2 logits");
  for (int64_t t = 0; t < 3; ++t) {
    TargetOutput step = m.forward_batch({{a[10 + t]}, {c[2 + t]}}, {&ca, &cc}, {}, TargetModel::Logits::Last);
    const std::string w = what + " decode step " + std::to_string(t);
    ASSERT_EQ(step.logits.dim(0), 2) << w;
    expect_rows(step.logits, 0, fa.logits.slice(10 + t, 11 + t), bf16, w + " seq 0");
    expect_rows(step.logits, 1, fc.logits.slice(2 + t, 3 + t), bf16, w + " seq 1");
    expect_rows(step.final_hidden, 1, fc.final_hidden.slice(2 + t, 3 + t), bf16, w + " seq 1 z");
  }
  EXPECT_EQ(ca.length(), 13);
  EXPECT_EQ(cc.length(), 5);
}

TEST(TargetBatch, PrefillEqualsSingleForwardsCpu) {
  auto self = self_comm();
  for (const auto& name : kFamilies) {
    TargetModel m(hf_fixture(name), *self);
    check_prefill(m, false, name);
  }
}

TEST(TargetBatch, CachesEqualSingleForwardsCpu) {
  auto self = self_comm();
  for (const auto& name : kFamilies) {
    TargetModel m(hf_fixture(name), *self);
    check_caches(m, false, name);
  }
}

TEST(TargetBatch, PrefillWithFreshCachesFillsThem) {
  // Every sequence at position 0 with a cache: the packed attention runs and the caches are filled, so
  // that a decoding step afterwards matches forward() of the whole sequence.
  auto self = self_comm();
  TargetModel m(hf_fixture("qwen3"), *self);
  const int64_t V = m.config().vocab_size;
  std::vector<int32_t> a = some_ids(8, V, 7), b = some_ids(4, V, 8);
  KVCache ca = m.make_cache(8), cb = m.make_cache(4);
  m.forward_batch({std::vector<int32_t>(a.begin(), a.end() - 1), std::vector<int32_t>(b.begin(), b.end() - 1)},
                  {&ca, &cb}, {}, TargetModel::Logits::None);
  TargetOutput step = m.forward_batch({{a.back()}, {b.back()}}, {&ca, &cb}, {}, TargetModel::Logits::Last);
  expect_rows(step.logits, 0, m.forward(a, nullptr, {}, true).logits.slice(7, 8), false, "qwen3 seq 0");
  expect_rows(step.logits, 1, m.forward(b, nullptr, {}, true).logits.slice(3, 4), false, "qwen3 seq 1");
}

// Where the tp overlap splits a forward: the sequence boundary nearest half the rows (the first when two are
// as near), and no split without two sequences, on one rank, with a cache or a token tree.
TEST(TargetBatch, OverlapSplitsAtTheMiddleBoundary) {
  const std::vector<std::vector<int32_t>> ids = {{1, 2, 3, 4, 5}, {1, 2}, {1, 2, 3, 4, 5, 6, 7}, {1, 2, 3}};  // 17 rows
  EXPECT_EQ(overlap_split(ids, {}, false, 2), 2);   // 7 rows | 10 (after 5: 5 | 12, after 14: 14 | 3)
  EXPECT_EQ(overlap_split({{1}, {1, 2, 3, 4, 5, 6}}, {}, false, 8), 1);  // the one boundary, however uneven
  EXPECT_EQ(overlap_split({{1, 2}, {1, 2}, {1, 2}}, {}, false, 2), 1);  // 2 | 4 and 4 | 2 as near: the first
  EXPECT_EQ(overlap_split(ids, {}, false, 1), 0);
  EXPECT_EQ(overlap_split({{1, 2, 3}}, {}, false, 2), 0);
  EXPECT_EQ(overlap_split(ids, {nullptr, nullptr, nullptr, nullptr}, false, 2), 2);
  KVCache cache({{1}}, {{1}}, 8);
  EXPECT_EQ(overlap_split(ids, {nullptr, &cache, nullptr, nullptr}, false, 2), 0);
  EXPECT_EQ(overlap_split(ids, {}, true, 2), 0);
}

// Why the overlap can split nothing: tp 1 first, then one sample per forward.
TEST(TargetBatch, OverlapUnusedSaysWhy) {
  EXPECT_EQ(tp_overlap_unused(1, 2048), "at tp 1 (no all-reduce)");
  EXPECT_EQ(tp_overlap_unused(2, 0), "with --batch-tokens 0 (one sample per forward)");
  EXPECT_EQ(tp_overlap_unused(2, 2048), "");
}

TEST(TargetBatch, RejectsMisuse) {
  auto self = self_comm();
  TargetModel m(hf_fixture("llama3_tied"), *self);
  KVCache c = m.make_cache(4), small = m.make_cache(1);
  EXPECT_NE(testing::error_of([&] { m.forward_batch({}, {}, {}, TargetModel::Logits::None); }).find("empty batch"),
            std::string::npos);
  EXPECT_NE(testing::error_of([&] { m.forward_batch({{1}, {}}, {}, {}, TargetModel::Logits::None); })
                .find("sequence 1 has no ids"),
            std::string::npos);
  EXPECT_NE(testing::error_of([&] { m.forward_batch({{1}, {2}}, {&c}, {}, TargetModel::Logits::None); })
                .find("1 caches for 2 sequences"),
            std::string::npos);
  EXPECT_NE(testing::error_of([&] { m.forward_batch({{1}, {2}}, {&c, &c}, {}, TargetModel::Logits::None); })
                .find("also another sequence's"),
            std::string::npos);
  EXPECT_NE(testing::error_of([&] { m.forward_batch({{1}, {2, 3}}, {&c, &small}, {}, TargetModel::Logits::None); })
                .find("KV cache of sequence 1 holds 1 positions"),
            std::string::npos);
  EXPECT_EQ(c.length(), 0);  // checks run before anything is written
}

// The two CUDA tests below run the per-sequence decoding attention (AERIE_BATCHED_DECODE=0); the batched
// one, CUDA's default, is BatchedDecodingEqualsSingleForwards.
TEST(TargetBatchCuda, F32EqualsSingleForwards) {
  AERIE_REQUIRE_CUDA();
  testing::ScopedEnv off("AERIE_BATCHED_DECODE", "0");
  auto self = self_comm();
  for (const auto& name : kFamilies) {
    TargetModel m(hf_fixture(name), *self, {Device::CUDA, DType::F32});
    check_prefill(m, false, name + " cuda f32");
    check_caches(m, false, name + " cuda f32");
  }
}

TEST(TargetBatchCuda, Bf16EqualsSingleForwards) {
  AERIE_REQUIRE_CUDA();
  testing::ScopedEnv off("AERIE_BATCHED_DECODE", "0");
  auto self = self_comm();
  for (const auto& name : kFamilies) {
    TargetModel m(hf_fixture(name), *self, {Device::CUDA, DType::BF16});
    check_prefill(m, true, name + " cuda bf16");
    check_caches(m, true, name + " cuda bf16");
  }
}

TEST(TargetBatchCuda, BatchedDecodingEqualsSingleForwards) {
  // check_caches' decoding steps (two cached sequences, one row each) through the batched decoding attention
  // (scatter_rows + attention_decode_batch), CUDA's default (model/blocks.h batched_decoding), set here so that
  // the test keeps testing it whatever the default.
  AERIE_REQUIRE_CUDA();
  testing::ScopedEnv on("AERIE_BATCHED_DECODE", "1");
  auto self = self_comm();
  for (const auto& name : kFamilies) {
    TargetModel f32(hf_fixture(name), *self, {Device::CUDA, DType::F32});
    check_caches(f32, false, name + " cuda f32 batched decoding");
    TargetModel b16(hf_fixture(name), *self, {Device::CUDA, DType::BF16});
    check_caches(b16, true, name + " cuda bf16 batched decoding");
  }
}

// The defaults of the batched decoding attention and the variable that overrides them (model/blocks.h):
// unset, the CPU takes cpu_default (GQA on, MLA off) and CUDA cuda_default (on); 1 and 0 decide everywhere;
// another value gives the default.
TEST(BatchedDecoding, DefaultsAndTheVariable) {
  {
    testing::ScopedEnv unset("AERIE_BATCHED_DECODE", nullptr);
    EXPECT_TRUE(batched_decoding(Device::CPU, true, true));
    EXPECT_FALSE(batched_decoding(Device::CPU, false, true));
    EXPECT_TRUE(batched_decoding(Device::CUDA, false, true));
    EXPECT_FALSE(batched_decoding(Device::CUDA, true, false));
  }
  {
    testing::ScopedEnv on("AERIE_BATCHED_DECODE", "1");
    EXPECT_TRUE(batched_decoding(Device::CPU, false, false));
    EXPECT_TRUE(batched_decoding(Device::CUDA, false, false));
  }
  {
    testing::ScopedEnv off("AERIE_BATCHED_DECODE", "0");
    EXPECT_FALSE(batched_decoding(Device::CPU, true, true));
    EXPECT_FALSE(batched_decoding(Device::CUDA, true, true));
  }
  testing::ScopedEnv odd("AERIE_BATCHED_DECODE", "yes");
  EXPECT_TRUE(batched_decoding(Device::CUDA, false, true));
  EXPECT_FALSE(batched_decoding(Device::CPU, false, true));
}

}  // namespace
}  // namespace aerie
