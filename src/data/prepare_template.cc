#include "data/prepare_template.h"

#include <numeric>

#include "core/error.h"
#include "data/chat_templates.h"

namespace aerie {

int64_t TokenizedSample::loss_tokens() const {
  int64_t n = 0;
  for (uint8_t m : loss_mask) n += m != 0;
  return n;
}

TokenizedSample ChatTemplate::apply(const Conversation& conversation, const Tokenizer& tokenizer) const {
  TokenizedSample s;
  for (const TemplateSegment& seg : render(conversation)) {
    std::vector<int32_t> ids = seg.ids.empty() ? encode_text(seg.text, tokenizer) : seg.ids;
    s.input_ids.insert(s.input_ids.end(), ids.begin(), ids.end());
    s.loss_mask.insert(s.loss_mask.end(), ids.size(), seg.trained ? 1 : 0);
  }
  return s;
}

PlainTemplate::PlainTemplate(int32_t bos_id, int32_t eos_id) : bos_(bos_id), eos_(eos_id) {
  AERIE_CHECK(eos_ >= 0, "chat template 'plain' needs a tokenizer with an EOS token");
}

std::vector<TemplateSegment> PlainTemplate::render(const Conversation& conversation) const {
  std::vector<TemplateSegment> out;
  if (bos_ >= 0) out.push_back({"", {bos_}, false});
  for (const ChatTurn& t : conversation.turns) {
    bool assistant = t.role == ChatRole::Assistant;
    if (assistant && !t.ids.empty()) out.push_back({t.text, t.ids, true});  // the target's own ids
    else if (!t.text.empty()) out.push_back({t.text, {}, assistant});
    if (assistant) out.push_back({"", {eos_}, !t.unfinished});  // not trained after an answer cut at its limit
  }
  return out;
}

std::unique_ptr<ChatTemplate> make_chat_template(const std::string& name, const Tokenizer& tokenizer) {
  if (name == "plain") return std::make_unique<PlainTemplate>(tokenizer.bos_id(), tokenizer.eos_id());
  return std::make_unique<ConfigChatTemplate>(ChatTemplateSpec::load(find_chat_template(name)), &tokenizer);
}

}  // namespace aerie
