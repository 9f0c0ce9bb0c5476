// A byte-level vocabulary without a piece for some bytes (SmolLM2-135M lacks 21 of them, e.g. 0x04):
// Hugging Face tokenizers (no unk_token) drops such a byte, and so must aerie. Expected ids from
// tokenizers 0.23 on the Llama-3 tokenizer.json with the piece for byte 0x04 ('Ą') removed.
#include <fstream>

#include <nlohmann/json.hpp>

#include "test_util.h"
#include "tokenizer/tokenizer.h"

namespace aerie {
namespace {

TEST(ByteLevelMissingByte, BytesWithoutAPieceAreDroppedAsTokenizersDoes) {
  const std::string src = testing::data_dir() + "/tokenizers/llama3/tokenizer.json";
  std::ifstream in(src);
  ASSERT_TRUE(in.good()) << src;
  nlohmann::json tj = nlohmann::json::parse(in);
  ASSERT_EQ(tj["model"]["vocab"].erase("\xc4\x84"), 1u);  // U+0104, the GPT-2 character of byte 0x04
  const std::string dir = testing::scratch_dir("tokenizer_missing_byte");
  std::ofstream(dir + "/tokenizer.json") << tj.dump();
  auto tok = Tokenizer::load(dir + "/tokenizer.json");
  EXPECT_EQ(tok->encode("a\x04" "b"), (std::vector<int32_t>{64, 65}));
  EXPECT_EQ(tok->encode("a\x04 b\x04"), (std::vector<int32_t>{64, 293}));
  EXPECT_EQ(tok->encode("\x04"), (std::vector<int32_t>{}));
  Encoding e = tok->encode_with_offsets("a\x04" "b");
  ASSERT_EQ(e.ids.size(), 2u);
  EXPECT_EQ(e.offsets.back().second, 3u);  // the dropped byte is covered by the next token's range
}

}  // namespace
}  // namespace aerie
