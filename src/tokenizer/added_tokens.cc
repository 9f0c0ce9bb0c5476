#include "tokenizer/added_tokens.h"

#include <algorithm>

#include "core/error.h"

namespace aerie::tok {

namespace {
bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }
}  // namespace

AddedTokens::AddedTokens(const nlohmann::json& added, const std::string& file) : by_first_byte_(256) {
  if (added.is_null()) return;
  AERIE_CHECK(added.is_array(), file << ": added_tokens is not an array");
  for (const auto& a : added) {
    AERIE_CHECK(a.is_object() && a.contains("id") && a.contains("content") && a["id"].is_number_integer() &&
                    a["content"].is_string(),
                file << ": malformed entry in added_tokens: " << a.dump());
    AddedToken t;
    t.id = a["id"].get<int32_t>();
    t.content = a["content"].get<std::string>();
    t.special = a.value("special", false);
    t.lstrip = a.value("lstrip", false);
    t.rstrip = a.value("rstrip", false);
    t.normalized = a.value("normalized", !t.special);  // tokenizers' AddedToken default
    AERIE_CHECK(!t.content.empty(), file << ": added token " << t.id << " is empty");
    by_id_[t.id] = tokens_.size();
    by_content_[t.content] = tokens_.size();
    tokens_.push_back(t);
  }
  for (size_t i = 0; i < tokens_.size(); ++i)
    by_first_byte_[static_cast<unsigned char>(tokens_[i].content[0])].push_back(i);
  for (auto& v : by_first_byte_)
    std::stable_sort(v.begin(), v.end(),
                     [&](size_t a, size_t b) { return tokens_[a].content.size() > tokens_[b].content.size(); });
}

const AddedToken* AddedTokens::find(int32_t id) const {
  auto it = by_id_.find(id);
  return it == by_id_.end() ? nullptr : &tokens_[it->second];
}

int32_t AddedTokens::id(const std::string& content) const {
  auto it = by_content_.find(content);
  return it == by_content_.end() ? -1 : tokens_[it->second].id;
}

std::vector<Segment> AddedTokens::split(const std::string& text, AddedMatch which) const {
  std::vector<Segment> out;
  if (tokens_.empty()) {
    if (!text.empty()) out.push_back({text, -1, 0, text.size()});
    return out;
  }
  size_t start = 0;  // start of the pending plain text
  size_t i = 0;
  while (i < text.size()) {
    const AddedToken* match = nullptr;
    for (size_t k : by_first_byte_[static_cast<unsigned char>(text[i])]) {
      const std::string& c = tokens_[k].content;
      if (which != AddedMatch::all && tokens_[k].normalized != (which == AddedMatch::normalized)) continue;
      if (text.compare(i, c.size(), c) == 0) {
        match = &tokens_[k];
        break;  // longest first
      }
    }
    if (!match) {
      ++i;
      continue;
    }
    size_t b = i, e = i + match->content.size();
    if (match->lstrip)
      while (b > start && is_space(text[b - 1])) --b;
    if (match->rstrip)
      while (e < text.size() && is_space(text[e])) ++e;
    if (b > start) out.push_back({text.substr(start, b - start), -1, start, b});
    out.push_back({"", match->id, b, e});
    start = i = e;
  }
  if (start < text.size()) out.push_back({text.substr(start), -1, start, text.size()});
  return out;
}

}  // namespace aerie::tok
