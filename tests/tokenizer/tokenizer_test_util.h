// Helpers of the tokenizer tests: files, llama.cpp's vocab-test goldens, offsets checks.
#pragma once
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "test_util.h"
#include "tokenizer/tokenizer.h"

namespace aerie::testing {

inline std::string read_file_text(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

/// `s` cut to 60 bytes with newlines shown as \n, for failure messages.
inline std::string shown(const std::string& s) {
  std::string out;
  for (char c : s) out += c == '\n' ? std::string("\\n") : std::string(1, c);
  return out.size() > 60 ? out.substr(0, 60) + "..." : out;
}

/// llama.cpp's test strings for vocabulary `name` (ggml-vocab-<name>.gguf.inp, split on
/// "\n__ggml_vocab_test__\n", as convert_hf_to_gguf_update.py writes them) with the ids of its .out (one
/// line per string: Hugging Face's encode(text, add_special_tokens=False), no BOS). Empty if absent.
inline std::vector<std::pair<std::string, std::vector<int32_t>>> llamacpp_cases(const std::string& name) {
  std::vector<std::pair<std::string, std::vector<int32_t>>> cases;
  const std::string base = data_dir() + "/llama.cpp-vocab-tests/ggml-vocab-" + name + ".gguf";
  if (!std::filesystem::exists(base + ".inp")) return cases;
  const std::string inp = read_file_text(base + ".inp");
  const std::string sep = "\n__ggml_vocab_test__\n";
  std::istringstream out(read_file_text(base + ".out"));
  std::string line;
  for (size_t i = 0, j; (j = inp.find(sep, i)) != std::string::npos && std::getline(out, line); i = j + sep.size()) {
    std::istringstream ls(line);
    std::vector<int32_t> ids;
    for (int32_t id; ls >> id;) ids.push_back(id);
    cases.push_back({inp.substr(i, j - i), ids});
  }
  return cases;
}

/// [b, e) widened to whole UTF-8 characters of `text` (Hugging Face reports character offsets).
inline std::pair<size_t, size_t> char_range(const std::string& text, size_t b, size_t e) {
  auto cont = [&](size_t k) { return k < text.size() && (static_cast<unsigned char>(text[k]) & 0xC0) == 0x80; };
  while (b > 0 && cont(b)) --b;
  if (e > b)
    while (cont(e)) ++e;
  return {b, e};
}

/// Offsets are in order and inside the text; with `disjoint` (no normalizer rewrote anything) they do
/// not overlap either.
inline void expect_ordered_offsets(const std::string& text, const Encoding& enc, bool disjoint = true) {
  ASSERT_EQ(enc.offsets.size(), enc.ids.size());
  size_t prev_b = 0, prev_e = 0;
  for (size_t k = 0; k < enc.offsets.size(); ++k) {
    const auto [b, e] = enc.offsets[k];
    EXPECT_LE(disjoint ? prev_e : prev_b, b) << "token " << k << " of '" << shown(text) << "'";
    EXPECT_LE(prev_e, e) << "token " << k << " of '" << shown(text) << "'";
    EXPECT_LE(b, e) << "token " << k << " of '" << shown(text) << "'";
    EXPECT_LE(e, text.size()) << "token " << k << " of '" << shown(text) << "'";
    prev_b = b;
    prev_e = e;
  }
}

}  // namespace aerie::testing
