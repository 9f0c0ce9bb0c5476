// Kimi-K2's tiktoken tokenizer (tokenizer/tiktoken.h) against tiktoken itself: ids and decode of
// tests/fixtures/tokenizer/kimi_k2.json (tools/reference/kimi_tokenizer_golden.py: llama.cpp's 46 strings,
// the byte-level edge cases, Chinese/emoji/code/special-token strings; all ShareGPT prompts as a hash),
// special ids, and errors on malformed tiktoken.model files.
#include <gtest/gtest.h>

#include <chrono>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "tokenizer/tiktoken.h"
#include "tokenizer_test_util.h"

namespace aerie {

using testing::read_file_text;
using testing::shown;

namespace {

std::string kimi_dir() { return testing::data_dir() + "/tokenizers/kimi-k2"; }

// Loaded once per test program (163,584 ranks).
const Tokenizer* kimi() {
  static std::unique_ptr<Tokenizer> tok;
  if (!tok && std::filesystem::exists(kimi_dir() + "/tiktoken.model")) tok = Tokenizer::load(kimi_dir());
  return tok.get();
}

nlohmann::json kimi_fixture() {
  return nlohmann::json::parse(read_file_text(std::string(AERIE_SOURCE_DIR) + "/tests/fixtures/tokenizer/kimi_k2.json"));
}

}  // namespace

TEST(KimiTokenizer, EncodeAndDecodeMatchTiktoken) {
  const Tokenizer* tok = kimi();
  if (!tok) GTEST_SKIP() << "no " << kimi_dir() << "/tiktoken.model";
  const auto fx = kimi_fixture();
  ASSERT_GE(fx["cases"].size(), 100u);
  int round_trips = 0;
  for (const auto& c : fx["cases"]) {
    const std::string text = c["text"].get<std::string>();
    const Encoding enc = tok->encode_with_offsets(text);
    EXPECT_EQ(enc.ids, c["ids"].get<std::vector<int32_t>>()) << "'" << shown(text) << "'";
    EXPECT_EQ(tok->encode(text), enc.ids);
    const std::string dec = tok->decode(enc.ids);
    EXPECT_EQ(dec, c["decoded"].get<std::string>()) << "decode of '" << shown(text) << "'";
    round_trips += dec == text;
    testing::expect_ordered_offsets(text, enc);
  }
  // All but the 6 strings with tokens that are special for Kimi (decode drops them).
  EXPECT_EQ(round_trips, static_cast<int>(fx["cases"].size()) - 6);
}

TEST(KimiTokenizer, SpecialIdsAndKnownIds) {
  const Tokenizer* tok = kimi();
  if (!tok) GTEST_SKIP() << "no " << kimi_dir() << "/tiktoken.model";
  EXPECT_EQ(tok->vocab_size(), 163840);
  EXPECT_EQ(tok->bos_id(), 163584);  // [BOS]
  EXPECT_EQ(tok->eos_id(), 163585);  // [EOS]
  EXPECT_EQ(tok->token_to_id("<|im_end|>"), 163586);
  EXPECT_EQ(tok->token_to_id("<|im_middle|>"), 163601);
  EXPECT_EQ(tok->token_to_id("<|tool_call_begin|>"), 163597);
  EXPECT_EQ(tok->token_to_id("<|reserved_token_163600|>"), 163600);
  EXPECT_EQ(tok->token_to_id("[PAD]"), 163839);
  // SOURCE.txt's ids (checked there with tiktoken and against SpecForge's references).
  EXPECT_EQ(tok->encode("Hello, world!"), (std::vector<int32_t>{19180, 11, 2695, 0}));
  EXPECT_EQ(tok->encode("\u4f60\u597d\uff0c\u4e16\u754c"), (std::vector<int32_t>{33845, 378, 2243}));
  EXPECT_EQ(tok->encode("1234567 I'm DON'T"), (std::vector<int32_t>{6694, 12972, 22, 6806, 92629, 64833}));
  // The tool-call tokens are not special (kept by decode), <|im_end|> is (dropped).
  EXPECT_EQ(tok->decode({163597, 19180, 163586}), "<|tool_call_begin|>Hello");
  // Decode gives back the bytes: a token that holds part of a character alone is U+FFFD.
  const auto ids = tok->encode("\xF0\x9F\xA6\x99");
  EXPECT_EQ(tok->decode(ids), "\xF0\x9F\xA6\x99");
}

TEST(KimiTokenizer, BuiltInRegexIsPatStr) {
  const std::string path = kimi_dir() + "/pat_str.txt";
  if (!std::filesystem::exists(path)) GTEST_SKIP() << "no " << path;
  std::string pat = read_file_text(path);
  while (!pat.empty() && pat.back() == '\n') pat.pop_back();
  EXPECT_EQ(pat, tok::kKimiPattern);
  // Class intersection (&&) keeps Han out of the letter runs: "a中b" is three pieces, Han runs stay whole.
  tok::Regex re(tok::kKimiPattern, "kKimiPattern");
  std::vector<std::pair<size_t, size_t>> m;
  const std::string s = "a\xE4\xB8\xAD" "b HelloWorld \xE4\xB8\xAD\xE6\x96\x87";
  re.find_all(s, m);
  std::vector<std::string> pieces;
  for (auto [b, e] : m) pieces.push_back(s.substr(b, e - b));
  EXPECT_EQ(pieces, (std::vector<std::string>{"a", "\xE4\xB8\xAD", "b", " Hello", "World", " ",
                                              "\xE4\xB8\xAD\xE6\x96\x87"}));
}

// All 2,978 ShareGPT prompts: total ids and FNV-1a hash equal tiktoken's; every prompt round-trips.
TEST(KimiTokenizer, ShareGptPromptsMatchTiktoken) {
  const Tokenizer* tok = kimi();
  const std::string path =
      testing::data_dir() + "/sharegpt-v3-prompts/sg_90k_part1_html_cleaned_lang_first_sampled_sorted.json";
  if (!tok || !std::filesystem::exists(path)) GTEST_SKIP() << "no kimi-k2 tokenizer or " << path;
  const auto want = kimi_fixture()["sharegpt"];
  const auto t0 = std::chrono::steady_clock::now();
  uint64_t h = 0xcbf29ce484222325ull;
  size_t total = 0, bad = 0, n = 0;
  for (const auto& rec : nlohmann::json::parse(read_file_text(path))) {
    const std::string p = rec["conversations"].empty() ? "" : rec["conversations"][0]["value"].get<std::string>();
    const auto ids = tok->encode(p);
    for (int32_t id : ids)
      for (int k = 0; k < 4; ++k) h = (h ^ ((static_cast<uint32_t>(id) >> (8 * k)) & 0xFF)) * 0x100000001b3ull;
    total += ids.size();
    bad += tok->decode(ids) != p;
    ++n;
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("[ sharegpt ] kimi-k2: %zu prompts, %zu ids, encoded and decoded in %.2f s\n", n, total, secs);
  EXPECT_EQ(n, want["prompts"].get<size_t>());
  EXPECT_EQ(total, want["total_ids"].get<size_t>());
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(h));
  EXPECT_EQ(std::string(hex), want["fnv1a64"].get<std::string>());
  EXPECT_EQ(bad, 0u);
  EXPECT_LT(secs, 30.0);
}

TEST(KimiTokenizer, MalformedTiktokenFilesNameFileAndLine) {
  const std::string dir = testing::scratch_dir("tiktoken_errors");
  // A valid file: the 256 bytes, then "ab" (rank 256).
  std::string good;
  const char* abc = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  auto b64 = [&](const std::string& s) {
    std::string out;
    for (size_t i = 0; i < s.size(); i += 3) {
      uint32_t v = static_cast<unsigned char>(s[i]) << 16;
      if (i + 1 < s.size()) v |= static_cast<unsigned char>(s[i + 1]) << 8;
      if (i + 2 < s.size()) v |= static_cast<unsigned char>(s[i + 2]);
      for (size_t k = 0; k < 4; ++k) out += i + k <= s.size() ? abc[(v >> (18 - 6 * k)) & 63] : '=';
    }
    return out;
  };
  for (int b = 0; b < 256; ++b) good += b64(std::string(1, static_cast<char>(b))) + " " + std::to_string(b) + "\n";
  good += b64("ab") + " 256\n";
  auto write = [&](const std::string& name, const std::string& text) {
    std::filesystem::create_directories(dir + "/" + name);
    std::ofstream(dir + "/" + name + "/tiktoken.model", std::ios::binary) << text;
    return dir + "/" + name;
  };
  auto tok = Tokenizer::load(write("good", good));
  EXPECT_EQ(tok->vocab_size(), 257 + 256);
  EXPECT_EQ(tok->encode("ab abc"), (std::vector<int32_t>{256, 32, 256, 99}));
  EXPECT_EQ(tok->decode({256, 32, 256, 99}), "ab abc");
  EXPECT_EQ(tok->bos_id(), -1);  // no tokenizer_config.json
  auto expect_error = [](const std::string& folder, const std::string& fragment) {
    const std::string msg = testing::error_of([&] { Tokenizer::load(folder); });
    EXPECT_NE(msg.find(fragment), std::string::npos) << msg;
    EXPECT_NE(msg.find(folder + "/tiktoken.model"), std::string::npos) << msg;
  };
  expect_error(write("no_rank", good + "YWJj\n"), "tiktoken.model:258: not '<base64 token> <rank>'");
  expect_error(write("bad_b64", good + "YW*j 257\n"), "tiktoken.model:258: bad base64");
  expect_error(write("twice", good + b64("abc") + " 256\n"), "tiktoken.model:258: rank 256 already given on line 257");
  expect_error(write("hole", good + b64("abc") + " 300\n"), "rank 257 is missing");
  expect_error(write("same_bytes", good + b64("ab") + " 257\n"), "ranks 256 and 257 have the same bytes");
  expect_error(write("no_bytes", b64("a") + " 0\n"), "byte 0 is not a token");
}

}  // namespace aerie
