// Chat templates of `aerie prepare`: a conversation -> tokens + loss mask.
//
// A template renders a conversation into segments (text or special token ids), each marked as trained on
// (assistant output) or not. Every segment is tokenized on its own and the pieces are concatenated, so the
// loss mask lines up with the tokens exactly (eagle3.md section 1: m_t = 1 on assistant content and the
// end-of-turn token that closes it; never on role headers, system, user or tool text).
//
// Built in: "plain" (documented at PlainTemplate). The templates of real chat models (llama3, llama3.1,
// mistral, qwen2.5, qwen3, qwen3-nothink, deepseek-v3, chatml, ...) are INI files in configs/templates/,
// rendered by ConfigChatTemplate (data/chat_templates.h) and checked against the models' Jinja templates.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "data/prepare_input.h"
#include "tokenizer/tokenizer.h"

namespace aerie {

/// A token sequence with its loss mask: input_ids [T] (target ids), loss_mask [T] (0/1).
struct TokenizedSample {
  std::vector<int32_t> input_ids;
  std::vector<uint8_t> loss_mask;
  int64_t loss_tokens() const;
};

/// One piece of a rendered conversation: `ids` if non-empty (special tokens), else `text` (tokenized on its
/// own, without BOS/EOS). `trained` = 1 puts the segment's tokens under the loss mask.
struct TemplateSegment {
  std::string text;
  std::vector<int32_t> ids;
  bool trained = false;
};

class ChatTemplate {
 public:
  virtual ~ChatTemplate() = default;
  virtual std::string name() const = 0;
  /// The segments of `conversation` in order. Throws aerie::Error if the template cannot render it.
  virtual std::vector<TemplateSegment> render(const Conversation& conversation) const = 0;
  /// The segments of a generation prompt for `conversation` (which ends with a user or tool turn): render
  /// plus the template's generation prompt (the assistant header). Default: render.
  virtual std::vector<TemplateSegment> render_prompt(const Conversation& conversation) const { return render(conversation); }
  /// The ids of one text segment. Default: tokenizer.encode(text).
  virtual std::vector<int32_t> encode_text(const std::string& text, const Tokenizer& tokenizer) const {
    return tokenizer.encode(text);
  }
  /// render, then tokenize each segment (encode_text) and concatenate (TokenizedSample of all segments).
  TokenizedSample apply(const Conversation& conversation, const Tokenizer& tokenizer) const;
};

/// "plain": BOS, then for each turn its text; every assistant turn is followed by EOS. The loss mask is 1
/// exactly on the tokens of assistant turns and on the EOS after each of them; BOS, system, user and tool
/// text get 0. No role headers, no separators (base models such as stories260K have no chat format;
/// TinyStories' text form becomes BOS + first sentence + rest of the story + EOS, i.e. the story itself).
/// The tokenizer's BOS/EOS ids are used; a tokenizer without EOS is an error (aerie::Error).
class PlainTemplate : public ChatTemplate {
 public:
  PlainTemplate(int32_t bos_id, int32_t eos_id);
  std::string name() const override { return "plain"; }
  std::vector<TemplateSegment> render(const Conversation& conversation) const override;

 private:
  int32_t bos_, eos_;
};

/// The template named `name` for `tokenizer`: "plain", or an INI template (a name of configs/templates/ or
/// the path of an .ini file; see find_chat_template). Throws aerie::Error on an unknown name, a bad file, or
/// a special token of the template that the tokenizer lacks.
std::unique_ptr<ChatTemplate> make_chat_template(const std::string& name, const Tokenizer& tokenizer);

}  // namespace aerie
