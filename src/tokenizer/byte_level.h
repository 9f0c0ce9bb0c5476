// Byte-level BPE in Hugging Face form (GPT-2, Llama-3, Qwen2/3, DeepSeek-V3; Kimi-K2's tiktoken files
// are loaded into the same class, tokenizer/tiktoken.h): added tokens are cut out
// of the input first (those with normalized=false in the raw text, then the others in the normalized
// text), the rest goes through the normalizer and the pre-tokenizer (tokenizer/pretokenizer.h), every
// byte of a pre-token becomes one character of GPT-2's byte -> unicode map, and BPE merges those by
// rank (with ignore_merges, a pre-token that is itself in the vocabulary is one token). Internal to
// src/tokenizer; use Tokenizer::load.
// Not implemented (throws on load): BPE dropout, byte_fallback, continuing_subword_prefix /
// end_of_word_suffix other than "", post-processors other than ByteLevel / TemplateProcessing / Sequence.
// The ByteLevel post-processor's trim_offsets is not applied: offsets keep a token's leading space, as
// Llama-3, Qwen2/3 and DeepSeek-V3 (trim_offsets false) have it.
#pragma once
#include <array>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include <nlohmann/json.hpp>

#include "tokenizer/added_tokens.h"
#include "tokenizer/bpe_model.h"
#include "tokenizer/pretokenizer.h"
#include "tokenizer/tokenizer.h"

namespace aerie::tok {

/// GPT-2's byte -> unicode map (tokenizers' pre_tokenizers/byte_level.rs bytes_char): the printable
/// bytes 33..126, 161..172 and 174..255 map to the code point of the same value, the other 68 bytes to
/// 256, 257, ... in byte order (so the space 0x20 is U+0120 "\u0120").
std::array<uint32_t, 256> gpt2_byte_to_unicode();

class ByteLevelBpe : public Tokenizer {
 public:
  /// `tj` is the parsed tokenizer.json of `file`. Throws aerie::Error naming `file` on a normalizer,
  /// pre-tokenizer, post-processor, decoder or model option this class does not implement, or a
  /// vocabulary that lacks one of the 256 byte characters.
  ByteLevelBpe(const nlohmann::json& tj, const std::string& file);
  /// The same with the vocabulary and merges given as `model`: `tj` holds the rest (added_tokens,
  /// normalizer, pre_tokenizer, post_processor, decoder) and in "model" only the options (ignore_merges,
  /// byte_fallback, ...). The tiktoken loader (tokenizer/tiktoken.h) builds its tokenizer so.
  ByteLevelBpe(BpeModel model, const nlohmann::json& tj, const std::string& file);

  std::vector<int32_t> encode(const std::string& text) const override;
  Encoding encode_with_offsets(const std::string& text) const override;
  /// tokenizers' ByteLevel decoder: each token's characters back to bytes (a token with a character
  /// outside the map, e.g. an added token "<｜User｜>", contributes its UTF-8 as is), then invalid UTF-8
  /// becomes U+FFFD per maximal invalid subsequence (Rust's String::from_utf8_lossy). Special tokens
  /// and ids outside the vocabulary are dropped.
  std::string decode(const std::vector<int32_t>& ids) const override;
  int64_t vocab_size() const override { return vocab_size_; }
  int32_t bos_id() const override { return bos_; }
  int32_t eos_id() const override { return eos_; }
  int32_t token_to_id(const std::string& token) const override;

  void set_special_ids(int32_t bos, int32_t eos) {
    bos_ = bos;
    eos_ = eos;
  }
  /// Ids that the post_processor (TemplateProcessing "single") puts before the text, e.g. Llama-3's
  /// <|begin_of_text|>; empty when there is none. encode() does not add them (BOS convention in
  /// tokenizer.h); Tokenizer::load takes the first as BOS when tokenizer_config.json names none.
  const std::vector<int32_t>& template_prefix() const { return prefix_; }

 private:
  void parse_post_processor(const nlohmann::json& p, const std::string& file);
  void parse_decoder(const nlohmann::json& d, const std::string& file);
  void encode_impl(const std::string& text, std::vector<int32_t>& ids,
                   std::vector<std::pair<size_t, size_t>>* offsets) const;
  // BPE of one pre-token (its bytes, the prefix space included): appends the ids and their byte lengths.
  void encode_word(const std::string& word, std::vector<int32_t>& ids, std::vector<uint32_t>& lens) const;

  BpeModel model_;
  AddedTokens added_;
  Normalizer normalizer_;
  PreTokenizer pre_;
  bool ignore_merges_ = false;
  std::array<int32_t, 256> byte_id_{};          // id of the one-character piece of each byte
  std::array<std::string, 256> byte_char_;      // UTF-8 of the mapped character of each byte
  std::vector<int16_t> char_byte_;              // mapped code point -> byte, -1 where none
  std::vector<int32_t> prefix_;
  int64_t vocab_size_ = 0;
  int32_t bos_ = -1, eos_ = -1;
  // Merge results per pre-token (bytes -> ids, lengths): chat text repeats words a lot.
  struct Cached {
    std::vector<int32_t> ids;
    std::vector<uint32_t> lens;
  };
  mutable std::mutex cache_mu_;
  mutable std::unordered_map<std::string, Cached> cache_;
};

}  // namespace aerie::tok
