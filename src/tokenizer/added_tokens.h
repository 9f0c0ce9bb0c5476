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
  bool normalized = false;  // matched in the normalized text (after the normalizer), not the raw input
};

/// One piece of the input: either plain text (token == -1) to normalize and run through the model, or
/// an added token's id.
struct Segment {
  std::string text;
  int32_t token = -1;
  size_t begin = 0, end = 0;  // byte range in the split text (an added token's includes stripped spaces)
};

/// Which added tokens AddedTokens::split looks for: all of them, those with normalized=false (matched in
/// the raw input, first) or those with normalized=true (matched after the normalizer), as tokenizers'
/// AddedVocabulary does in two passes.
enum class AddedMatch { all, raw, normalized };

/// As tokenizers' AddedVocabulary::split_with_indices: the text is cut at every occurrence of an added
/// token, matched literally in the raw text, leftmost-longest; these become their id whatever the
/// model would make of them (so "<s>" in user text is BOS, as Hugging Face tokenizers does).
/// Simplifications (none matters for the tokenizers aerie reads): single_word is ignored, lstrip/rstrip
/// strip ASCII whitespace only, the content of a normalized token is not itself normalized; with
/// AddedMatch::all (the sentencepiece BPE) normalized tokens are matched in the raw text too.
class AddedTokens {
 public:
  AddedTokens() = default;
  /// Parses the "added_tokens" array (may be null). Throws aerie::Error naming `file` if malformed.
  AddedTokens(const nlohmann::json& added, const std::string& file);

  std::vector<Segment> split(const std::string& text, AddedMatch which = AddedMatch::all) const;
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
