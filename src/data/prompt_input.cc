// Prompt sets (see prompt_input.h): one record as a conversation, and the records of a file by index.
#include "data/prompt_input.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "data/chat_templates_json.h"
#include "io/h5.h"

namespace aerie {

namespace fs = std::filesystem;
using ojson = nlohmann::ordered_json;

namespace {

PromptRecord skipped(SkipReason why, std::string detail) {
  PromptRecord r;
  r.skip = why;
  r.detail = std::move(detail);
  return r;
}

bool is_blank(const std::string& s) {
  return std::all_of(s.begin(), s.end(), [](char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n'; });
}

std::string dump(const ojson& j) { return chat::dump_exact(j); }

// A conversation record (ShareGPT or OpenAI): its turns, read by prepare's reader with an empty assistant
// turn appended, so that prompt-only records (ending with a user turn) parse too.
PromptRecord conversation_record(const std::string& text, ojson j, InputFormat f) {
  const bool sharegpt = f == InputFormat::ShareGPT;
  const std::string key = sharegpt ? "conversations" : "messages";
  if (!j.contains(key) || !j[key].is_array()) return skipped(SkipReason::WrongTypes, "no '" + key + "' array");
  const size_t n_msgs = j[key].size();
  j[key].push_back(sharegpt ? ojson{{"from", "gpt"}, {"value", ""}} : ojson{{"role", "assistant"}, {"content", ""}});
  InputRecord rec = parse_json_record(dump(j), f, INT32_MAX);
  if (rec.skip != SkipReason::None) return skipped(rec.skip, rec.detail);
  rec.conversation.turns.pop_back();
  AERIE_CHECK(rec.conversation.turns.size() >= n_msgs && rec.conversation.turns.size() - n_msgs <= 1,
              "prompt set: " << rec.conversation.turns.size() << " parsed turns for " << n_msgs << " messages");
  PromptRecord out;
  out.format = f;
  out.json = text;
  out.conversation = std::move(rec.conversation);
  return out;
}

// A plain prompt (MT-Bench "turns", or "prompt" / "text" / "question" / "instruction") as OpenAI messages
// after the record's other keys.
PromptRecord plain_prompt_record(const ojson& j) {
  std::vector<std::string> used;
  std::vector<ChatTurn> turns;
  if (j.contains("system")) {
    if (!j["system"].is_string()) return skipped(SkipReason::WrongTypes, "'system' is not a string");
    used.push_back("system");
    if (!j["system"].get<std::string>().empty()) turns.push_back({ChatRole::System, j["system"].get<std::string>()});
  }
  if (j.contains("turns")) {
    const ojson& t = j["turns"];
    if (!t.is_array() || t.empty()) return skipped(SkipReason::WrongTypes, "'turns' is not a non-empty list of strings");
    for (size_t k = 0; k < t.size(); ++k) {
      if (!t[k].is_string()) return skipped(SkipReason::WrongTypes, "turns[" + std::to_string(k) + "] is not a string");
      if (k > 0) turns.push_back({ChatRole::Assistant, ""});  // answered by generate, unused by eval
      turns.push_back({ChatRole::User, t[k].get<std::string>()});
    }
    used.push_back("turns");
  } else {
    bool found = false;
    for (const std::string& key : prompt_keys()) {
      if (key == "turns" || !j.contains(key) || !j[key].is_string()) continue;
      std::string text = j[key].get<std::string>();
      used.push_back(key);
      if (key == "instruction" && j.contains("input") && j["input"].is_string()) {
        const std::string input = j["input"].get<std::string>();  // Alpaca: the instruction's material
        if (!input.empty()) text += "\n\n" + input;
        used.push_back("input");
      }
      turns.push_back({ChatRole::User, std::move(text)});
      found = true;
      break;
    }
    if (!found)
      return skipped(SkipReason::WrongTypes, "none of the keys 'conversations', 'messages' (a conversation), 'turns' (a "
                                             "list of strings), 'prompt', 'text', 'question', 'instruction' (a string)");
  }
  // A prompt of only whitespace asks nothing: eval would measure the draft on the template's header alone.
  const bool asks = std::any_of(turns.begin(), turns.end(), [](const ChatTurn& t) {
    return t.role == ChatRole::User && t.text.find_first_not_of(" \t\r\n") != std::string::npos;
  });
  if (!asks) {
    const auto key = std::find_if(used.begin(), used.end(), [](const std::string& k) { return k != "system"; });
    return skipped(SkipReason::Empty, "the prompt ('" + (key == used.end() ? std::string("?") : *key) + "') is empty");
  }
  ojson out = ojson::object();
  for (auto it = j.begin(); it != j.end(); ++it)
    if (std::find(used.begin(), used.end(), it.key()) == used.end()) out[it.key()] = it.value();
  ojson msgs = ojson::array();
  for (const ChatTurn& t : turns) msgs.push_back({{"role", role_name(t.role)}, {"content", t.text}});
  out["messages"] = std::move(msgs);
  PromptRecord r;
  r.format = InputFormat::OpenAI;
  r.json = dump(out);
  r.conversation.turns = std::move(turns);
  return r;
}

}  // namespace

const std::vector<std::string>& prompt_keys() {
  static const std::vector<std::string> keys = {"turns", "prompt", "text", "question", "instruction"};
  return keys;
}

PromptRecord parse_prompt_record(const std::string& record, InputFormat format) {
  AERIE_CHECK(format == InputFormat::Auto || format == InputFormat::ShareGPT || format == InputFormat::OpenAI ||
                  format == InputFormat::Text,
              "prompt set: format " << input_format_name(format) << " has no prompts or conversations (use auto, "
                                    << "sharegpt, openai or text)");
  // A NUL byte (a damaged line in a text file) makes the record unusable, not the file: named with its column.
  if (const size_t nul = record.find('\0'); nul != std::string::npos)
    return skipped(SkipReason::BadJson, "a NUL byte at column " + std::to_string(nul + 1) +
                                           (format == InputFormat::Text ? " of the story" : ": not valid JSON"));
  if (format == InputFormat::Text) {
    InputRecord story = parse_story(record);
    if (story.skip != SkipReason::None) return skipped(story.skip, story.detail);
    const std::string& prompt = story.conversation.turns.at(0).text;
    PromptRecord r;
    r.format = InputFormat::OpenAI;
    r.json = dump(ojson{{"messages", ojson::array({ojson{{"role", "user"}, {"content", prompt}}})}});
    r.conversation.turns.push_back({ChatRole::User, prompt});
    return r;
  }
  if (is_blank(record)) return skipped(SkipReason::Empty, "blank line");
  ojson j = chat::parse_json_exact(record);
  if (j.is_discarded()) return skipped(SkipReason::BadJson, "not valid JSON");
  if (!j.is_object()) return skipped(SkipReason::BadJson, "not a JSON object");
  if (format == InputFormat::Auto) {
    if (j.contains("conversations")) return conversation_record(record, std::move(j), InputFormat::ShareGPT);
    if (j.contains("messages")) return conversation_record(record, std::move(j), InputFormat::OpenAI);
    return plain_prompt_record(j);
  }
  return conversation_record(record, std::move(j), format);
}

// ------------------------------------------------------------------------------------------------ files

struct PromptFile::Array {
  ojson elements;
};

PromptFile::PromptFile(const std::string& path, InputFormat format) : path_(path) {
  AERIE_CHECK(fs::is_regular_file(path), "prompt set " << path << ": no such file");
  {  // A binary file (a prepared HDF5 file, a shard, a checkpoint) given as prompts: named before any parse.
    std::ifstream in(path, std::ios::binary);
    char head[512];
    in.read(head, sizeof head);
    const std::string h(head, static_cast<size_t>(in.gcount()));
    AERIE_CHECK(h.rfind(h5::kSignature, 0) != 0,
                "prompt set " << path << " is an HDF5 file (a prepared file or a shard?): prompts are a text file "
                              << "(.txt, paragraphs), JSONL or a JSON array of prompts or conversations");
    // Binary formats (safetensors' 8-byte header size, zip, pickles) hold many NUL bytes at their start; one
    // NUL in a text file is a damaged record (parse_prompt_record names it), not a binary file.
    const size_t nul = h.find('\0');
    AERIE_CHECK(std::count(h.begin(), h.end(), '\0') < 2,
                "prompt set " << path << " is a binary file (NUL bytes from byte offset " << nul << " on): prompts "
                              << "are a text file (.txt, paragraphs), JSONL or a JSON array of prompts or conversations");
  }
  const bool text = format == InputFormat::Text ||
                    (format == InputFormat::Auto && path.size() >= 4 && path.compare(path.size() - 4, 4, ".txt") == 0);
  record_format_ = text ? InputFormat::Text : format;
  if (!text && is_json_array_file(path)) {
    std::ifstream in(path, std::ios::binary);
    array_ = std::make_unique<Array>();
    array_->elements = chat::parse_json_exact(in);
    AERIE_CHECK(!array_->elements.is_discarded() && array_->elements.is_array(),
                "prompt set " << path << " starts with '[' but is not one valid JSON array (use JSONL: one record "
                              << "per line)");
    size_ = static_cast<int64_t>(array_->elements.size());
    return;
  }
  std::ifstream in(path, std::ios::binary);
  AERIE_CHECK(in, "prompt set " << path << ": cannot open it");
  // JSONL: every line is a record; text: a story starts at a non-blank line after a blank one (or the
  // file's start), as for_each_record splits them.
  std::string line;
  int64_t pos = 0, line_no = 0;
  bool after_blank = true;
  while (std::getline(in, line)) {
    const bool blank = text && std::all_of(line.begin(), line.end(), [](char c) { return c == ' ' || c == '\t' || c == '\r'; });
    if (!text || (!blank && after_blank)) {
      offsets_.push_back(pos);
      lines_.push_back(line_no);
    }
    after_blank = blank;
    pos += static_cast<int64_t>(line.size()) + 1;
    ++line_no;
  }
  AERIE_CHECK(!in.bad(), "prompt set " << path << ": read error");
  std::error_code ec;
  file_size_ = static_cast<int64_t>(fs::file_size(path, ec));
  AERIE_CHECK(!ec, "prompt set " << path << ": cannot read its size: " << ec.message());
  size_ = static_cast<int64_t>(offsets_.size());
}

PromptFile::~PromptFile() = default;
PromptFile::PromptFile(PromptFile&&) noexcept = default;

std::vector<std::string> PromptFile::read(int64_t b, int64_t e) const {
  AERIE_CHECK(0 <= b && b <= e && e <= size_,
              "prompt set " << path_ << ": records [" << b << ", " << e << ") out of range [0, " << size_ << ")");
  std::vector<std::string> out;
  if (array_) {
    for (int64_t i = b; i < e; ++i) out.push_back(dump(array_->elements[static_cast<size_t>(i)]));
    return out;
  }
  if (b == e) return out;
  InputRange range;
  range.begin = offsets_[static_cast<size_t>(b)];
  range.end = e < size_ ? offsets_[static_cast<size_t>(e)] : file_size_;
  for_each_record(path_, range, record_format_ == InputFormat::Text,
                  [&](const std::string& rec, int64_t, int64_t) { out.push_back(rec); });
  AERIE_CHECK(static_cast<int64_t>(out.size()) == e - b,
              "prompt set " << path_ << ": read " << out.size() << " records at " << where(b) << ", expected " << e - b
                            << " (was the file changed while it was read?)");
  return out;
}

std::string PromptFile::where(int64_t i) const {
  if (array_) return path_ + " element " + std::to_string(i);
  const int64_t line = i >= 0 && i < size_ ? lines_[static_cast<size_t>(i)] + 1 : -1;
  return path_ + ":" + std::to_string(line);
}

}  // namespace aerie
