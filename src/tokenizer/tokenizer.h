// Tokenizers. aerie reads a Hugging Face tokenizer.json: the sentencepiece-style BPE with byte fallback
// (Llama-2, Mistral v1, stories260K's tok512; tokenizer/sentencepiece_bpe.h) and the byte-level BPE of
// GPT-2, Llama-3, Qwen2/3 and DeepSeek-V3 (tokenizer/byte_level.h), with their added and special tokens;
// and Kimi-K2's tiktoken.model folder (tokenizer/tiktoken.h, loaded into the byte-level BPE).
//
// BOS convention: encode() never adds BOS/EOS, also where Hugging Face's encode(add_special_tokens=True)
// would (a TemplateProcessing post_processor, add_bos_token). bos_id() names the token a caller puts in
// front (data/prepare_template's templates, train/eval_run do); it is -1 for tokenizers without one
// (Qwen: tokenizer_config.json "bos_token": null). So encode(text) equals Hugging Face's
// encode(text, add_special_tokens=False), which is what chat templates are tokenized with.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace aerie {

/// Ids with, per id, the byte range [begin, end) of the input it came from (UTF-8 bytes, not characters:
/// a byte-level token that holds part of a character covers just those bytes). Tokens follow each other
/// in the input: ranges are ordered, do not overlap, and are empty for text that no input bytes stand
/// for (sentencepiece's added "\u2581" alone, ByteLevel's added prefix space alone). Spaces that an added
/// token's lstrip/rstrip swallows belong to that token; bytes a Split "Removed" drops belong to none.
/// Where a normalizer (NFC) rewrote a run of characters, every token from that run covers the whole run.
struct Encoding {
  std::vector<int32_t> ids;
  std::vector<std::pair<size_t, size_t>> offsets;  // (N) [begin, end) byte offsets into the input
};

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  /// Token ids of `text` (UTF-8), without BOS/EOS (see the BOS convention above). Never throws on
  /// valid UTF-8; unknown bytes go through byte fallback (sentencepiece BPE) or their byte tokens
  /// (byte-level BPE).
  virtual std::vector<int32_t> encode(const std::string& text) const = 0;
  /// encode() plus the byte offsets of every token in `text`. Throws aerie::Error for a tokenizer that
  /// does not track offsets (none of aerie's own).
  virtual Encoding encode_with_offsets(const std::string& text) const;
  /// Text of `ids` (special tokens like BOS/EOS dropped; with sentencepiece the leading space of the
  /// first piece removed, as sentencepiece does; with byte-level BPE the bytes of the tokens, invalid
  /// UTF-8 replaced by U+FFFD as Hugging Face's ByteLevel decoder does).
  virtual std::string decode(const std::vector<int32_t>& ids) const = 0;
  virtual int64_t vocab_size() const = 0;
  virtual int32_t bos_id() const = 0;  // -1 if none
  virtual int32_t eos_id() const = 0;  // -1 if none
  /// Id of a token string (e.g. "<|eot_id|>"), -1 if absent.
  virtual int32_t token_to_id(const std::string& token) const = 0;

  /// Loads "<dir>/tokenizer.json" (and tokenizer_config.json where present) or a tokenizer.json
  /// path; a folder with tiktoken.model and no tokenizer.json (Kimi-K2's form), or a tiktoken.model
  /// path, is read as a tiktoken tokenizer (tokenizer/tiktoken.h). Throws aerie::Error naming the file
  /// on an unsupported model type, bad JSON or a malformed tiktoken.model line.
  static std::unique_ptr<Tokenizer> load(const std::string& path);
};

}  // namespace aerie
