// Sentencepiece-style BPE in Hugging Face form (Llama-2, Mistral v1, stories260K's tok512): spaces
// become "\u2581" and a "\u2581" is prepended (normalizer Prepend + Replace, or pre_tokenizer
// Metaspace), the whole text is one word for BPE by merge rank, characters outside the vocabulary go
// to <0xNN> byte pieces (byte_fallback). Internal to src/tokenizer; use Tokenizer::load.
#pragma once
#include <array>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tokenizer/added_tokens.h"
#include "tokenizer/bpe_model.h"
#include "tokenizer/tokenizer.h"

namespace aerie::tok {

class SentencePieceBpe : public Tokenizer {
 public:
  /// `tj` is the parsed tokenizer.json of `file`. Throws aerie::Error naming `file` on a normalizer,
  /// pre-tokenizer or decoder this class does not implement.
  SentencePieceBpe(const nlohmann::json& tj, const std::string& file);

  std::vector<int32_t> encode(const std::string& text) const override;
  /// Offsets follow the normalizer: an inserted "\u2581" stands for no input byte, one that replaced a
  /// space for that space.
  Encoding encode_with_offsets(const std::string& text) const override;
  std::string decode(const std::vector<int32_t>& ids) const override;
  int64_t vocab_size() const override { return vocab_size_; }
  int32_t bos_id() const override { return bos_; }
  int32_t eos_id() const override { return eos_; }
  int32_t token_to_id(const std::string& token) const override;

  void set_special_ids(int32_t bos, int32_t eos) {
    bos_ = bos;
    eos_ = eos;
  }

 private:
  struct NormStep {
    bool prepend;  // Prepend(a) if true, else Replace(a -> b)
    std::string a, b;
  };
  void parse_normalizer(const nlohmann::json& n, const std::string& file);
  void parse_pre_tokenizer(const nlohmann::json& p, const std::string& file);
  void parse_decoder(const nlohmann::json& d, const std::string& file);
  // Normalized text with, per byte, the input byte range [b, e) it stands for (relative to the segment).
  struct Aligned {
    std::string s;
    std::vector<uint32_t> b, e;
  };
  void encode_impl(const std::string& text, std::vector<int32_t>& ids,
                   std::vector<std::pair<size_t, size_t>>* offsets) const;
  // Normalizes one plain segment (`at_start`: it begins the text) and appends its ids to `out` and,
  // with `offsets`, their input ranges shifted by `base`.
  void encode_segment(const std::string& seg, bool at_start, size_t base, std::vector<int32_t>& out,
                      std::vector<std::pair<size_t, size_t>>* offsets) const;
  // BPE of a.s[begin, end); appends the ids and their lengths in bytes of a.s.
  void encode_word(const Aligned& a, size_t begin, size_t end, std::vector<int32_t>& out,
                   std::vector<uint32_t>& lens) const;

  BpeModel model_;
  AddedTokens added_;
  std::vector<NormStep> norm_;
  // pre_tokenizer Metaspace (tokenizers >= 0.19 Llama/Mistral conversions)
  bool metaspace_ = false;
  std::string ms_replacement_ = "\u2581";
  std::string ms_prepend_ = "always";  // "always" | "first" | "never"
  bool ms_split_ = false;
  // decoder
  int strip_leading_spaces_ = 0;     // Strip decoder: spaces removed from the start of the text
  bool metaspace_decoder_ = false;   // Metaspace decoder: "\u2581" -> " "
  bool ms_drop_first_ = false;       // ... and the first piece's "\u2581"s dropped (prepend_scheme != never)
  bool byte_fallback_decoder_ = false;  // ByteFallback decoder: <0xNN> pieces -> bytes
  bool replace_decoder_ = false;        // Replace("\u2581", " ") decoder
  bool byte_fallback_ = false;
  bool fuse_unk_ = false;
  int32_t unk_ = -1;
  std::array<int32_t, 256> byte_ids_{};  // <0xNN> piece ids, -1 where absent
  int64_t vocab_size_ = 0;
  int32_t bos_ = -1, eos_ = -1;
};

}  // namespace aerie::tok
