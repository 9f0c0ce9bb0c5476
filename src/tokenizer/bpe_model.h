// The BPE model of a Hugging Face tokenizer.json ("model": {"type": "BPE", "vocab", "merges", ...}),
// shared by the tokenizer kinds: vocabulary, merge ranks, and the merge loop of one word.
// Internal to src/tokenizer.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <nlohmann/json.hpp>

namespace aerie::tok {

/// Vocabulary + ranked merges. Merging follows tokenizers' models/bpe/word.rs (Word::merge_all):
/// repeatedly merge the adjacent pair of lowest merge rank, the leftmost one on ties, until no pair of
/// the word has a merge.
class BpeModel {
 public:
  /// Parses model.vocab ({piece: id}) and model.merges (["a b", ...] or [["a", "b"], ...]).
  /// Throws aerie::Error naming `file` on a malformed model or a merge whose parts or result are not
  /// in the vocabulary.
  BpeModel(const nlohmann::json& model, const std::string& file);

  /// One merge: the adjacent symbols (left, right) become `merged`; the pair of lowest `rank` merges first.
  struct Merge {
    int32_t left, right, rank, merged;
  };
  /// A model given directly: `pieces` by id ("" for an id without a piece) and the merges (ids into
  /// `pieces`), as tokenizer/tiktoken.h derives them from a tiktoken file. Throws aerie::Error naming
  /// `file` on a piece that occurs twice or a merge whose ids are not pieces.
  BpeModel(std::vector<std::string> pieces, const std::vector<Merge>& merges, const std::string& file);

  /// Id of `piece`, -1 if absent.
  int32_t id(const std::string& piece) const {
    auto it = vocab_.find(piece);
    return it == vocab_.end() ? -1 : it->second;
  }
  /// Piece of `id`, or an empty string for an id outside the vocabulary.
  const std::string& piece(int32_t id) const;
  /// 1 + the largest id of the vocabulary.
  int64_t size() const { return static_cast<int64_t>(pieces_.size()); }

  /// Merges the symbols `ids` (initial pieces, in order) and appends the result to `out`. With `lens`
  /// (one length per initial symbol, e.g. its bytes of normalized text), the lengths of the merged
  /// symbols (sums of their parts) are appended to `out_lens`.
  void merge(std::vector<int32_t>& ids, std::vector<int32_t>& out, std::vector<uint32_t>* lens = nullptr,
             std::vector<uint32_t>* out_lens = nullptr) const;

 private:
  std::unordered_map<std::string, int32_t> vocab_;
  std::vector<std::string> pieces_;  // by id; "" for holes
  // (left id << 32 | right id) -> (rank, merged id)
  std::unordered_map<uint64_t, std::pair<int32_t, int32_t>> merges_;
};

/// Byte length of the UTF-8 sequence starting with lead byte `c` (1 for a stray continuation byte).
inline size_t utf8_len(unsigned char c) {
  if (c < 0x80) return 1;
  if ((c >> 5) == 0x6) return 2;
  if ((c >> 4) == 0xE) return 3;
  if ((c >> 3) == 0x1E) return 4;
  return 1;
}

/// Code point of the valid UTF-8 sequence at s[i] and its length (1..4), or length 0 if the bytes there
/// are not valid UTF-8 (overlong forms, surrogates and values above U+10FFFF are invalid).
size_t decode_utf8(std::string_view s, size_t i, uint32_t& cp);
/// Appends the UTF-8 encoding of code point `cp` (< 0x110000) to `out`.
void append_utf8(uint32_t cp, std::string& out);
/// Length of the valid UTF-8 sequence at s[i] (1..4), or 0 if the bytes there are not valid UTF-8.
inline size_t utf8_valid_len(const std::string& s, size_t i) {
  uint32_t cp;
  return decode_utf8(s, i, cp);
}

}  // namespace aerie::tok
