// Tokenizers. aerie reads a Hugging Face tokenizer.json; this build implements the sentencepiece-style
// BPE with byte fallback (Llama-2, stories260K's tok512); the byte-level BPE of Llama-3/Qwen is the
// chat-target issue's.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace aerie {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  /// Token ids of `text` (UTF-8), without BOS/EOS. Never throws on valid UTF-8; unknown bytes go
  /// through byte fallback.
  virtual std::vector<int32_t> encode(const std::string& text) const = 0;
  /// Text of `ids` (special tokens like BOS/EOS dropped; the leading space of the first piece
  /// removed, as sentencepiece does).
  virtual std::string decode(const std::vector<int32_t>& ids) const = 0;
  virtual int64_t vocab_size() const = 0;
  virtual int32_t bos_id() const = 0;  // -1 if none
  virtual int32_t eos_id() const = 0;  // -1 if none
  /// Id of a token string (e.g. "<|eot_id|>"), -1 if absent.
  virtual int32_t token_to_id(const std::string& token) const = 0;

  /// Loads "<dir>/tokenizer.json" (and tokenizer_config.json where present) or a tokenizer.json
  /// path. Throws aerie::Error naming the file on an unsupported model type or bad JSON.
  static std::unique_ptr<Tokenizer> load(const std::string& path);
};

}  // namespace aerie
