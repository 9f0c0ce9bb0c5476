// Tokenizer tests on the converted stories260K tokenizer (tok512).
#include "tokenizer/tokenizer.h"

#include <gtest/gtest.h>

#include "core/error.h"
#include "test_util.h"

namespace aerie {

namespace {
std::unique_ptr<Tokenizer> tok512() { return Tokenizer::load(testing::model_dir()); }
}  // namespace

TEST(Tok512, LoadsWithSpecialIds) {
  AERIE_REQUIRE_MODEL();
  auto t = tok512();
  EXPECT_EQ(t->vocab_size(), 512);
  EXPECT_EQ(t->bos_id(), 1);
  EXPECT_EQ(t->eos_id(), 2);
  EXPECT_EQ(t->token_to_id("<unk>"), 0);
  EXPECT_EQ(t->token_to_id("<0x0A>"), 3 + 0x0A);
  EXPECT_EQ(t->token_to_id("\u2581the"), 265);
  EXPECT_EQ(t->token_to_id("no such piece"), -1);
}

TEST(Tok512, EncodeDecodeBasics) {
  AERIE_REQUIRE_MODEL();
  auto t = tok512();
  EXPECT_TRUE(t->encode("").empty());
  // " the" is one piece (id 265): the dummy prefix space makes "the" at the start "\u2581the".
  EXPECT_EQ(t->encode("the"), (std::vector<int32_t>{265}));
  // "\n" is not a piece: byte fallback to <0x0A> (id 13), after the "\u2581" piece.
  const auto nl = t->encode("\n");
  ASSERT_FALSE(nl.empty());
  EXPECT_EQ(nl.back(), 13);
  for (const std::string s : {"Once upon a time, there was a little girl named Lily.", "a\nb", "  two  spaces",
                              "caf\xC3\xA9 \xF0\x9F\x98\x80 \xE4\xB8\xAD\xE6\x96\x87 123", "<s>x</s>"}) {
    EXPECT_EQ(t->decode(t->encode(s)), s == std::string("<s>x</s>") ? std::string("x") : s) << s;
  }
  // Special tokens in the text are split out (as Hugging Face tokenizers does) and dropped by decode.
  const auto sp = t->encode("<s>x</s>");
  ASSERT_GE(sp.size(), 3u);
  EXPECT_EQ(sp.front(), 1);
  EXPECT_EQ(sp.back(), 2);
}

TEST(Tok512, InvalidUtf8GoesThroughByteFallback) {
  AERIE_REQUIRE_MODEL();
  auto t = tok512();
  // A stray continuation byte and a truncated 3-byte sequence: each byte becomes its <0xNN> piece
  // (id = 3 + byte); decode turns the invalid run into U+FFFD per byte, as tokenizers' ByteFallback.
  const auto ids = t->encode("a\x80\xE4\xB8");
  ASSERT_GE(ids.size(), 3u);
  EXPECT_EQ((std::vector<int32_t>(ids.end() - 3, ids.end())), (std::vector<int32_t>{3 + 0x80, 3 + 0xE4, 3 + 0xB8}));
  EXPECT_EQ(t->decode(ids), "a\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");
  // Ids outside the vocabulary are ignored by decode.
  EXPECT_EQ(t->decode({-5, 100000, t->token_to_id("\u2581the")}), "the");
}

}  // namespace aerie
