// DraftDecoder: the chain it proposes equals the TTT argmax chain on the same data ("training sees what
// inference sees", eagle3.md section 4), with the cache built in pieces and after a truncation.
#include <gtest/gtest.h>

#include <random>

#include "draft_testing.h"
#include "model/draft.h"
#include "test_util.h"

namespace aerie {
namespace {

std::vector<int32_t> ids_slice(const std::vector<int32_t>& x, int64_t b, int64_t e) {
  return std::vector<int32_t>(x.begin() + b, x.begin() + e);
}

void expect_propose_equals_ttt_chain(const testing::TinyDraft& m, uint64_t seed) {
  {
    const int n = 5;
    const int64_t p = 6, T = p + n + 1;
    auto s = testing::make_tiny_sample(m, T, 200 + seed);
    DraftDecoder dec(m.cfg, m.w, m.embed, m.d2t, 32);
    // Positions 0..2, then 3..5 with wrong next tokens (a rejected draft), dropped again, then 3..p.
    dec.append_verified(s.aux_hidden.slice(0, 3), ids_slice(s.ids, 1, 4));
    dec.append_verified(s.aux_hidden.slice(3, 6), {7, 7, 7});
    ASSERT_EQ(dec.length(), 6);
    dec.truncate(3);
    dec.append_verified(s.aux_hidden.slice(3, p + 1), ids_slice(s.ids, 4, p + 2));
    ASSERT_EQ(dec.length(), p + 1);
    std::vector<std::vector<float>> dl;
    std::vector<int32_t> guess = dec.propose(n, &dl);
    ASSERT_EQ(guess.size(), static_cast<size_t>(n));
    ASSERT_EQ(dl.size(), static_cast<size_t>(n));
    // Teacher-force the draft's own guesses: x_{p+1+j} = guess j (j = 1..n-1; guess n needs no input).
    std::vector<int32_t> ids = s.ids;
    for (int j = 1; j < n; ++j) ids[p + 1 + j] = guess[j - 1];
    std::mt19937_64 rng(seed);
    Tensor z = testing::random_tensor({T, 8}, rng, 1.0);
    auto s2 = make_ttt_sample(ids, s.loss_mask, s.aux_hidden, z, m.target_lm, m.selected);
    std::vector<Tensor> logits;
    ttt_forward_backward(m.cfg, m.w, m.embed, s2, m.d2t, m.t2d, n, std::vector<double>(n, 1.0), nullptr, &logits);
    for (int k = 0; k < n; ++k) {
      ASSERT_GT(logits[k].dim(0), p) << "row p exists at step " << k;
      std::vector<float> row = logits[k].slice(p, p + 1).to_float_vector();
      testing::expect_close(dl[k], row, 1e-5f, 1e-5f, "step " + std::to_string(k));
      const int64_t am = std::max_element(row.begin(), row.end()) - row.begin();
      EXPECT_EQ(guess[k], am + m.d2t[am]) << "seed " << seed << " step " << k;
    }
  }
}

TEST(DraftDecoder, ProposeEqualsTTTArgmaxChain) {
  for (uint64_t seed : {1u, 2u, 3u, 4u, 5u, 6u, 7u, 8u, 9u, 10u}) {
    auto m = testing::make_tiny_draft(100 + seed);
    m.cfg.norm_before_residual = seed == 4 || seed == 7;  // EAGLE-3.1's residual base, in decoding as in training
    m.cfg.norm_output = seed == 5 || seed == 7 || seed == 9;  // EAGLE-3.1's norm(o) handed to the next step
    if (seed == 6 || seed == 7) testing::enable_norm_before_fc(m, 300 + seed);  // EAGLE-3.1's input_norm(f)
    if (seed == 10) testing::enable_fc_norm(m, 310);  // EAGLE-3.1's per-chunk fc_norm.k(f_k)
    // A sliding window: the cache's prefill rows and the chain see the last W keys, as the TTT rows do.
    m.cfg.sliding_window = seed == 8 ? 3 : seed == 9 ? 1 : 0;
    expect_propose_equals_ttt_chain(m, seed);
  }
}

// The MLA draft (its latent attention in the cache and in the chain's diagonal), with and without the
// query LoRA, and with norm_output.
TEST(DraftDecoder, MlaProposeEqualsTTTArgmaxChain) {
  for (uint64_t seed : {1u, 2u, 3u}) {
    auto m = testing::make_tiny_mla_draft(400 + seed, seed == 2 ? 0 : 6);
    m.cfg.norm_output = seed == 3;
    expect_propose_equals_ttt_chain(m, seed);
  }
}

// A verified token outside the target's embedding is refused by the draft layer's host check (the ids of
// a decoding step are checked on the host, then gathered without a check), naming the id.
TEST(DraftDecoder, RefusesATokenOutsideTheEmbedding) {
  auto m = testing::make_tiny_draft(9);
  auto s = testing::make_tiny_sample(m, 6, 10);
  DraftDecoder dec(m.cfg, m.w, m.embed, m.d2t, 16);
  const int32_t bad = static_cast<int32_t>(m.embed.dim(0));
  try {
    dec.append_verified(s.aux_hidden.slice(0, 2), {1, bad});
    FAIL() << "no error for token id " << bad;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("token id " + std::to_string(bad)), std::string::npos) << e.what();
  }
}

// The chain's keys stay out of the cache: proposing twice gives the same guesses, and a shorter chain
// is a prefix of a longer one.
TEST(DraftDecoder, ProposeLeavesTheCacheAlone) {
  auto m = testing::make_tiny_draft(7);
  auto s = testing::make_tiny_sample(m, 10, 8);
  DraftDecoder dec(m.cfg, m.w, m.embed, m.d2t, 16);
  dec.append_verified(s.aux_hidden.slice(0, 5), ids_slice(s.ids, 1, 6));
  auto a = dec.propose(4);
  auto b = dec.propose(4);
  EXPECT_EQ(a, b);
  EXPECT_EQ(dec.length(), 5);
  EXPECT_EQ(dec.propose(2), std::vector<int32_t>(a.begin(), a.begin() + 2));
}

TEST(DraftDecoder, RejectsMisuse) {
  auto m = testing::make_tiny_draft(9);
  auto s = testing::make_tiny_sample(m, 10, 10);
  DraftDecoder dec(m.cfg, m.w, m.embed, m.d2t, 4);
  EXPECT_THROW(dec.propose(2), Error);
  EXPECT_THROW(dec.append_verified(s.aux_hidden.slice(0, 5), ids_slice(s.ids, 1, 6)), Error);  // > max_len
  EXPECT_THROW(dec.append_verified(s.aux_hidden.slice(0, 3), ids_slice(s.ids, 1, 3)), Error);  // 3 rows, 2 ids
  dec.append_verified(s.aux_hidden.slice(0, 2), ids_slice(s.ids, 1, 3));
  EXPECT_THROW(dec.truncate(3), Error);
  EXPECT_THROW(dec.propose(0), Error);
  auto bad = m.d2t;
  bad.pop_back();
  EXPECT_THROW(DraftDecoder(m.cfg, m.w, m.embed, bad, 4), Error);
}

}  // namespace
}  // namespace aerie
