// The text pipeline in front of a byte-level BPE model, as Hugging Face tokenizers runs it from a
// tokenizer.json: the "normalizer" (NFC/NFD/NFKC/NFKD, Sequence, none) with the alignment of every
// normalized byte to the input, and the "pre_tokenizer" (Sequence of Split / ByteLevel / Digits) that cuts
// the normalized text into pre-tokens. Regexes are compiled with ICU (Oniguruma syntax translated, see
// Regex::translate). Internal to src/tokenizer.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>
#include <unicode/normalizer2.h>
#include <unicode/regex.h>

namespace aerie::tok {

/// A regex of a tokenizer.json ("pattern": {"Regex": ...}), written for Oniguruma (the engine of
/// Hugging Face tokenizers), compiled with ICU's regex engine. Both are backtracking engines with
/// Perl semantics (leftmost match, alternatives in order), and ICU has every construct the Llama-3,
/// Qwen2/3, DeepSeek-V3 and GPT-2 patterns use: \p{L} \p{N} \p{M} \p{P} \p{S}, (?i:...), (?!...),
/// {m,n}, possessive and atomic forms. Immutable and safe to share between threads.
class Regex {
 public:
  /// Throws aerie::Error naming `file` and the pattern if ICU rejects it.
  Regex(const std::string& pattern, const std::string& file);

  /// Oniguruma -> ICU translation. Oniguruma's \s / \S are Unicode White_Space (includes U+000B and
  /// U+0085, which ICU's \s = [\t\n\f\r\p{Z}] lacks), so they become \p{White_Space} / \P{White_Space}
  /// (also inside [...]); \h / \H (Oniguruma: hex digit) become [0-9A-Fa-f] / [^0-9A-Fa-f]. Everything
  /// else is passed through unchanged.
  static std::string translate(const std::string& onig);

  /// Appends the byte ranges [begin, end) of the successive non-overlapping matches of the regex in
  /// `s` (UTF-8; an invalid byte is matched as U+FFFD) to `out`. Empty matches are reported too.
  void find_all(std::string_view s, std::vector<std::pair<size_t, size_t>>& out) const;

 private:
  std::unique_ptr<icu::RegexPattern> pattern_;
};

/// Text after the normalizer, with for every byte of `text` the byte range [begin, end) of the input it
/// came from. Empty `begin`/`end` mean the identity (text == input).
struct Normalized {
  std::string text;
  std::vector<uint32_t> begin, end;
  /// Input range of the normalized byte range [b, e) (e <= text.size()); an empty range maps to the
  /// input position of byte b (the input's end when b == text.size()). `input_size`: bytes of the input.
  std::pair<size_t, size_t> input_range(size_t b, size_t e, size_t input_size) const;
};

/// The "normalizer" of a tokenizer.json: null, {"type": "Sequence", "normalizers": [...]} or one of
/// NFC / NFD / NFKC / NFKD (Unicode normal forms with ICU). Other types throw aerie::Error naming `file`.
class Normalizer {
 public:
  Normalizer(const nlohmann::json& n, const std::string& file);
  bool identity() const { return forms_.empty(); }
  /// Normalized `s`. Text that is already normalized keeps the identity alignment; otherwise the text is
  /// normalized chunk by chunk (between normalization boundaries) and every output byte is aligned to its
  /// input chunk. Invalid UTF-8 bytes pass through unchanged.
  Normalized apply(const std::string& s) const;

 private:
  std::vector<const icu::Normalizer2*> forms_;
};

/// A piece of the normalized text: bytes [begin, end), preceded by a space that is not in the text when
/// `prefix_space` (ByteLevel add_prefix_space); that space stands for no input bytes.
struct PreToken {
  size_t begin = 0, end = 0;
  bool prefix_space = false;
};

/// The "pre_tokenizer" of a byte-level tokenizer.json, after tokenizers' pre_tokenizers/{split,
/// byte_level,digits,sequence}.rs:
///   Split {pattern: {Regex|String}, behavior: Removed|Isolated|MergedWithPrevious|MergedWithNext|
///          Contiguous, invert}: matches (or with invert, the text between matches) are the delimiters;
///   Digits {individual_digits}: ASCII digits, each alone (Isolated) or in runs (Contiguous);
///   ByteLevel {add_prefix_space, use_regex}: a space before every piece that does not start with one,
///          then (use_regex) the GPT-2 regex, Isolated. It must come last (the byte -> unicode mapping
///          itself is left to the model).
/// Empty pieces are dropped. Other types throw aerie::Error naming `file`.
class PreTokenizer {
 public:
  PreTokenizer(const nlohmann::json& p, const std::string& file);
  /// Replaces `pieces` (ranges of `text`) by their pre-tokens, in order.
  void split(const std::string& text, std::vector<PreToken>& pieces) const;
  bool has_byte_level() const { return byte_level_; }

  /// tokenizers' SplitDelimiterBehavior.
  enum class Behavior { removed, isolated, merged_with_previous, merged_with_next, contiguous };

 private:
  struct Step {
    enum Kind { split, digits, byte_level } kind = split;
    std::shared_ptr<Regex> regex;  // split with a Regex pattern; byte_level with use_regex
    std::string literal;           // split with a String pattern
    Behavior behavior = Behavior::isolated;
    bool invert = false;
    bool add_prefix_space = false;
  };
  void parse(const nlohmann::json& p, const std::string& file);
  void apply(const Step& st, const std::string& text, const PreToken& in, std::vector<PreToken>& out) const;

  std::vector<Step> steps_;
  bool byte_level_ = false;
};

/// The GPT-2 pre-tokenization regex (tokenizers' ByteLevel with use_regex).
extern const char* const kGpt2Regex;

}  // namespace aerie::tok
