// Added tokens of a Hugging Face tokenizer.json ("added_tokens": [{id, content, special, lstrip, rstrip,
// normalized, single_word}]) and the split of the input text around them. Internal to src/tokenizer.
#pragma once
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include <nlohmann/json.hpp>

namespace aerie::tok {

struct AddedToken {
  int32_t id = -1;
  std::string content;
  bool special = false;
  bool lstrip = false;  // the match swallows whitespace on its left
  bool rstrip = false;  // ... and on its right
};

/// One piece of the input: either plain text (token == -1) to normalize and run through the model, or
/// an added token's id.
struct Segment {
  std::string text;
  int32_t token = -1;
};

/// As tokenizers' AddedVocabulary::split_with_indices: the text is cut at every occurrence of an added
/// token, matched literally in the raw text, leftmost-longest; these become their id whatever the
/// model would make of them (so "<s>" in user text is BOS, as Hugging Face tokenizers does).
/// Simplifications (none matters for the tokenizers aerie reads): tokens with normalized=true are also
/// matched in the raw text, single_word is ignored, lstrip/rstrip strip ASCII whitespace only.
class AddedTokens {
 public:
  AddedTokens() = default;
  /// Parses the "added_tokens" array (may be null). Throws aerie::Error naming `file` if malformed.
  AddedTokens(const nlohmann::json& added, const std::string& file);

  std::vector<Segment> split(const std::string& text) const;
  const std::vector<AddedToken>& tokens() const { return tokens_; }
  /// The token with `id`, nullptr if `id` is not an added token.
  const AddedToken* find(int32_t id) const;
  int32_t id(const std::string& content) const;

 private:
  std::vector<AddedToken> tokens_;
  std::unordered_map<int32_t, size_t> by_id_;
  std::unordered_map<std::string, size_t> by_content_;
  std::vector<std::vector<size_t>> by_first_byte_;  // [256] -> token indices, longest first
};

}  // namespace aerie::tok
