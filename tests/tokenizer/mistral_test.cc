// Mistral's own goldens (../shared/data/tokenizers/mistral/samples, from mistral-common's tests): the
// rendered instruct text of each chat request and its exact ids, for the v1 tokenizer (tokenizer.model.v1)
// and v3 (mistral_instruct_tokenizer_240323.model.v3, control tokens [INST], [TOOL_CALLS], ...), both
// converted to tokenizer.json by the build (tools/convert_llama2c.py).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "tokenizer_test_util.h"

namespace aerie {

namespace {

// text_vN.txt is the concatenation of the pieces: "\u2581" for spaces, "<0x0A>" for byte pieces, and
// mistral-common encodes each segment between control tokens with sentencepiece's dummy prefix "\u2581".
// The same ids come from the tokenizer.json given the text with spaces, real bytes, and no space after
// a special token (its normalizer prepends the "\u2581" to every segment, as sentencepiece does).
std::string sample_text(std::string t, const std::vector<std::string>& specials) {
  const std::string sp = "\u2581";
  for (const std::string& s : specials)
    for (size_t i = 0; (i = t.find(s + sp, i)) != std::string::npos;) t.erase(i + s.size(), sp.size());
  std::string out;
  for (size_t i = 0; i < t.size();) {
    if (t.compare(i, sp.size(), sp) == 0) {
      out += ' ';
      i += sp.size();
    } else if (t.compare(i, 3, "<0x") == 0 && i + 6 <= t.size() && t[i + 5] == '>') {
      out += static_cast<char>(std::stoi(t.substr(i + 3, 2), nullptr, 16));
      i += 6;
    } else {
      out += t[i++];
    }
  }
  return out;
}

}  // namespace

TEST(MistralSamples, ExactIdsOfMistralCommon) {
  const std::string samples = testing::data_dir() + "/tokenizers/mistral/samples";
  if (!std::filesystem::exists(samples)) GTEST_SKIP() << "no " << samples;
  int checked = 0;
  for (const std::string v : {"v1", "v3"}) {
    const std::string dir = std::string(AERIE_BINARY_DIR) + "/models/tokenizers/mistral_" + v;
    if (!std::filesystem::exists(dir + "/tokenizer.json")) {
      ADD_FAILURE() << "not converted: " << dir;
      continue;
    }
    auto tok = Tokenizer::load(dir);
    std::vector<std::string> specials;
    const auto tj = nlohmann::json::parse(testing::read_file_text(dir + "/tokenizer.json"));
    for (const auto& a : tj["added_tokens"])
      if (a.value("special", false)) specials.push_back(a["content"].get<std::string>());
    for (const auto& entry : std::filesystem::directory_iterator(samples)) {
      const std::string txt = entry.path().string() + "/text_" + v + ".txt";
      if (!std::filesystem::exists(txt)) continue;
      const auto want = nlohmann::json::parse(testing::read_file_text(entry.path().string() + "/tokens_" + v + ".json"))
                            ["tokens"].get<std::vector<int32_t>>();
      const std::string text = sample_text(testing::read_file_text(txt), specials);
      EXPECT_EQ(tok->encode(text), want) << v << " " << entry.path().filename() << ": '" << testing::shown(text) << "'";
      ++checked;
    }
  }
  EXPECT_EQ(checked, 7);  // no_tools in v1; six requests (tools, tool calls, results) in v3
}

}  // namespace aerie
