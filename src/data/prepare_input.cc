#include "data/prepare_input.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "data/chat_templates_json.h"

namespace aerie {

// ordered_json: tool arguments and tool definitions keep their key order (chat templates print them).
using json = nlohmann::ordered_json;

const char* role_name(ChatRole r) {
  switch (r) {
    case ChatRole::System: return "system";
    case ChatRole::User: return "user";
    case ChatRole::Assistant: return "assistant";
    case ChatRole::Tool: return "tool";
  }
  return "?";
}

InputFormat input_format_from_name(const std::string& name) {
  if (name == "auto") return InputFormat::Auto;
  if (name == "sharegpt") return InputFormat::ShareGPT;
  if (name == "openai") return InputFormat::OpenAI;
  if (name == "tokenized") return InputFormat::Tokenized;
  if (name == "text") return InputFormat::Text;
  AERIE_THROW("unknown input format '" << name << "' (auto, sharegpt, openai, tokenized, text)");
}

const char* input_format_name(InputFormat f) {
  switch (f) {
    case InputFormat::Auto: return "auto";
    case InputFormat::ShareGPT: return "sharegpt";
    case InputFormat::OpenAI: return "openai";
    case InputFormat::Tokenized: return "tokenized";
    case InputFormat::Text: return "text";
  }
  return "?";
}

const char* skip_name(SkipReason s) {
  switch (s) {
    case SkipReason::None: return "none";
    case SkipReason::Empty: return "empty";
    case SkipReason::BadJson: return "bad JSON";
    case SkipReason::WrongTypes: return "wrong keys or types";
    case SkipReason::NoAssistant: return "no assistant turn";
    case SkipReason::NoRest: return "single sentence";
    case SkipReason::ZeroLoss: return "no loss tokens";
    case SkipReason::Overlong: return "overlong (dropped)";
    case SkipReason::EmptyAnswer: return "empty answer";
    case SkipReason::Count_: break;
  }
  return "?";
}

namespace {

InputRecord skip(SkipReason why, std::string detail) {
  InputRecord r;
  r.skip = why;
  r.detail = std::move(detail);
  return r;
}

// Finishes a conversation record: NoAssistant unless some assistant turn exists.
InputRecord conversation_record(Conversation c) {
  if (c.turns.empty()) return skip(SkipReason::Empty, "no turns");
  bool any = std::any_of(c.turns.begin(), c.turns.end(), [](const ChatTurn& t) { return t.role == ChatRole::Assistant; });
  if (!any) return skip(SkipReason::NoAssistant, "");
  InputRecord r;
  r.conversation = std::move(c);
  return r;
}

// The record's "tools" (an array, or a string holding a JSON array) into c.tools_json; false if malformed.
bool read_tools(const json& j, Conversation& c, std::string& why) {
  if (!j.contains("tools") || j["tools"].is_null()) return true;
  json tools = j["tools"];
  if (tools.is_string()) {
    if (tools.get<std::string>().empty()) return true;
    tools = chat::parse_json_exact(tools.get<std::string>());
  }
  if (!tools.is_array()) {
    why = "'tools' is not an array (or a string holding one)";
    return false;
  }
  if (!tools.empty()) c.tools_json = chat::python_json(tools);
  return true;
}

// ShareGPT "function_call" value {"name", "arguments"|"parameters"} (or an array of them) -> tool_calls;
// anything else stays plain assistant text, and false is returned (the caller notes it).
bool read_function_call(ChatTurn& turn) {
  json v = chat::parse_json_exact(turn.text);
  if (v.is_object()) v = json::array({v});
  if (!v.is_array() || v.empty()) return false;
  std::vector<ToolCall> calls;
  for (const json& f : v) {
    if (!f.is_object() || !f.contains("name") || !f["name"].is_string()) return false;
    ToolCall call;
    call.name = f["name"].get<std::string>();
    const json args = f.contains("arguments") ? f["arguments"] : f.contains("parameters") ? f["parameters"] : json::object();
    if (args.is_string()) {
      call.arguments = args.get<std::string>();
      call.arguments_is_string = true;
    } else {
      call.arguments = chat::python_json(args);
    }
    calls.push_back(std::move(call));
  }
  turn.tool_calls = std::move(calls);
  turn.text_is_tool_calls = true;
  return true;
}

// An assistant message's "aerie_response_ids" (written by aerie generate) into turn.ids: false when the
// field is there but not a list of non-negative integers.
bool read_response_ids(const json& m, ChatTurn& turn) {
  // generate marks an answer that reached its token limit without a stop token: its end of turn is not the
  // target's (trained it would teach the draft an end the target never writes there).
  turn.unfinished = m.contains("aerie_finish_reason") && m["aerie_finish_reason"] == "length";
  if (!m.contains("aerie_response_ids")) return true;
  const json& ids = m["aerie_response_ids"];
  if (!ids.is_array()) return false;
  for (const json& v : ids) {
    if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > INT32_MAX) return false;
    turn.ids.push_back(static_cast<int32_t>(v.get<int64_t>()));
  }
  return true;
}

InputRecord parse_sharegpt(const json& j) {
  const json& conv = j.at("conversations");
  if (!conv.is_array()) return skip(SkipReason::WrongTypes, "'conversations' is not an array");
  Conversation c;
  std::string why, note;
  if (!read_tools(j, c, why)) return skip(SkipReason::WrongTypes, why);
  if (j.contains("system")) {
    if (!j["system"].is_string()) return skip(SkipReason::WrongTypes, "'system' is not a string");
    if (!j["system"].get<std::string>().empty()) c.turns.push_back({ChatRole::System, j["system"].get<std::string>()});
  }
  for (size_t i = 0; i < conv.size(); ++i) {
    const json& t = conv[i];
    if (!t.is_object() || !t.contains("from") || !t.contains("value") || !t["from"].is_string() ||
        !t["value"].is_string())
      return skip(SkipReason::WrongTypes, "turn " + std::to_string(i) + " needs string 'from' and 'value'");
    std::string from = t["from"].get<std::string>();
    ChatRole role;
    if (from == "human" || from == "user") role = ChatRole::User;
    else if (from == "gpt" || from == "assistant" || from == "function_call") role = ChatRole::Assistant;
    else if (from == "system") role = ChatRole::System;
    else if (from == "observation" || from == "tool") role = ChatRole::Tool;
    else return skip(SkipReason::WrongTypes, "turn " + std::to_string(i) + ": unknown role '" + from + "'");
    ChatTurn turn{role, t["value"].get<std::string>()};
    if (from == "function_call" && !read_function_call(turn) && note.empty())
      note = "turn " + std::to_string(i) + ": a function_call value that is no JSON {\"name\", \"arguments\"} object "
             "(or array of them) is trained as plain assistant text";
    if (role == ChatRole::Assistant && !read_response_ids(t, turn))
      return skip(SkipReason::WrongTypes, "turn " + std::to_string(i) + ": 'aerie_response_ids' is not a list of ids");
    c.turns.push_back(std::move(turn));
  }
  InputRecord r = conversation_record(std::move(c));
  if (r.skip == SkipReason::None) r.note = std::move(note);
  return r;
}

InputRecord parse_openai(const json& j) {
  const json& msgs = j.at("messages");
  if (!msgs.is_array()) return skip(SkipReason::WrongTypes, "'messages' is not an array");
  Conversation c;
  std::string why;
  if (!read_tools(j, c, why)) return skip(SkipReason::WrongTypes, why);
  for (size_t i = 0; i < msgs.size(); ++i) {
    const json& m = msgs[i];
    std::string where = "message " + std::to_string(i);
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string())
      return skip(SkipReason::WrongTypes, where + " needs a string 'role'");
    std::string r = m["role"].get<std::string>();
    ChatRole role;
    if (r == "user") role = ChatRole::User;
    else if (r == "assistant") role = ChatRole::Assistant;
    else if (r == "system" || r == "developer") role = ChatRole::System;
    else if (r == "tool") role = ChatRole::Tool;
    else return skip(SkipReason::WrongTypes, where + ": unknown role '" + r + "'");
    ChatTurn turn{role, ""};
    if (role == ChatRole::Assistant && m.contains("tool_calls") && !m["tool_calls"].is_null()) {
      const json& calls = m["tool_calls"];
      if (!calls.is_array()) return skip(SkipReason::WrongTypes, where + ": 'tool_calls' is not an array");
      for (size_t k = 0; k < calls.size(); ++k) {
        const json& tc = calls[k];
        const std::string cw = where + " tool_calls[" + std::to_string(k) + "]";
        // {"id", "type", "function": {"name", "arguments"}}, or the function object itself
        const json& fn = tc.is_object() && tc.contains("function") ? tc["function"] : tc;
        if (!fn.is_object() || !fn.contains("name") || !fn["name"].is_string())
          return skip(SkipReason::WrongTypes, cw + " needs a string function 'name'");
        ToolCall call;
        call.name = fn["name"].get<std::string>();
        if (tc.contains("id") && tc["id"].is_string()) call.id = tc["id"].get<std::string>();
        const json args = fn.contains("arguments") ? fn["arguments"] : json::object();
        if (args.is_string()) {
          call.arguments = args.get<std::string>();
          call.arguments_is_string = true;
        } else if (args.is_object() || args.is_null()) {
          call.arguments = chat::python_json(args.is_null() ? json::object() : args);
        } else {
          return skip(SkipReason::WrongTypes, cw + ": 'arguments' is neither a string nor an object");
        }
        turn.tool_calls.push_back(std::move(call));
      }
    }
    for (const char* key : {"reasoning_content", "reasoning", "thinking"}) {
      if (!m.contains(key) || m[key].is_null()) continue;
      if (!m[key].is_string()) return skip(SkipReason::WrongTypes, where + ": '" + key + "' is not a string");
      turn.reasoning = m[key].get<std::string>();
      turn.has_reasoning = true;
      break;
    }
    if (role == ChatRole::Tool) {
      if (m.contains("tool_call_id") && m["tool_call_id"].is_string()) turn.tool_call_id = m["tool_call_id"].get<std::string>();
      if (m.contains("name") && m["name"].is_string()) turn.name = m["name"].get<std::string>();
    }
    if (!m.contains("content") || m["content"].is_null()) {
      if (turn.tool_calls.empty()) return skip(SkipReason::WrongTypes, where + " has no 'content'");
      turn.content_null = true;
      c.turns.push_back(std::move(turn));
      continue;
    }
    const json& content = m["content"];
    std::string text;
    if (content.is_string()) {
      text = content.get<std::string>();
    } else if (content.is_array()) {
      for (const json& part : content) {
        if (!part.is_object() || part.value("type", "") != "text" || !part.contains("text") || !part["text"].is_string())
          return skip(SkipReason::WrongTypes, where + ": content parts must be {\"type\": \"text\", \"text\": str}");
        text += part["text"].get<std::string>();
      }
    } else {
      return skip(SkipReason::WrongTypes, where + ": 'content' is neither a string nor a list of text parts");
    }
    turn.text = std::move(text);
    if (role == ChatRole::Assistant && !read_response_ids(m, turn))
      return skip(SkipReason::WrongTypes, where + ": 'aerie_response_ids' is not a list of ids");
    c.turns.push_back(std::move(turn));
  }
  return conversation_record(std::move(c));
}

InputRecord parse_tokenized(const json& j, int64_t vocab_size) {
  const json& ids = j.at("input_ids");
  if (!j.contains("loss_mask")) return skip(SkipReason::WrongTypes, "'input_ids' without 'loss_mask'");
  const json& mask = j["loss_mask"];
  if (!ids.is_array() || !mask.is_array()) return skip(SkipReason::WrongTypes, "'input_ids'/'loss_mask' are not arrays");
  if (ids.size() != mask.size())
    return skip(SkipReason::WrongTypes, "input_ids has " + std::to_string(ids.size()) + " entries, loss_mask " +
                                            std::to_string(mask.size()));
  if (ids.empty()) return skip(SkipReason::Empty, "no tokens");
  InputRecord r;
  r.tokenized = true;
  r.input_ids.reserve(ids.size());
  r.loss_mask.reserve(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    if (!ids[i].is_number_integer()) return skip(SkipReason::WrongTypes, "input_ids[" + std::to_string(i) + "] is not an integer");
    int64_t id = ids[i].get<int64_t>();
    if (id < 0 || id >= vocab_size)
      return skip(SkipReason::WrongTypes, "input_ids[" + std::to_string(i) + "] = " + std::to_string(id) +
                                              " outside [0, " + std::to_string(vocab_size) + ")");
    int64_t m = 0;
    if (mask[i].is_boolean()) m = mask[i].get<bool>();
    else if (mask[i].is_number_integer()) m = mask[i].get<int64_t>();
    else m = -1;
    if (m != 0 && m != 1) return skip(SkipReason::WrongTypes, "loss_mask[" + std::to_string(i) + "] is not 0 or 1");
    r.input_ids.push_back(static_cast<int32_t>(id));
    r.loss_mask.push_back(static_cast<uint8_t>(m));
  }
  return r;
}

bool is_blank(const std::string& line) {
  return std::all_of(line.begin(), line.end(), [](char c) { return c == ' ' || c == '\t' || c == '\r'; });
}

}  // namespace

namespace {

InputRecord parse_json_value(const json& j, InputFormat format, int64_t vocab_size) {
  if (!j.is_object()) return skip(SkipReason::BadJson, "not a JSON object");
  if (format == InputFormat::Auto) {
    if (j.contains("conversations")) format = InputFormat::ShareGPT;
    else if (j.contains("messages")) format = InputFormat::OpenAI;
    else if (j.contains("input_ids")) format = InputFormat::Tokenized;
    else return skip(SkipReason::WrongTypes, "none of the keys 'conversations', 'messages', 'input_ids'");
  }
  switch (format) {
    case InputFormat::ShareGPT:
      if (!j.contains("conversations")) return skip(SkipReason::WrongTypes, "no 'conversations' key");
      return parse_sharegpt(j);
    case InputFormat::OpenAI:
      if (!j.contains("messages")) return skip(SkipReason::WrongTypes, "no 'messages' key");
      return parse_openai(j);
    case InputFormat::Tokenized:
      if (!j.contains("input_ids")) return skip(SkipReason::WrongTypes, "no 'input_ids' key");
      return parse_tokenized(j, vocab_size);
    default: break;
  }
  AERIE_THROW("prepare: format " << input_format_name(format) << " is not a JSON format");
}

}  // namespace

InputRecord parse_json_record(const std::string& line, InputFormat format, int64_t vocab_size) {
  if (is_blank(line)) return skip(SkipReason::Empty, "blank line");
  json j = chat::parse_json_exact(line);
  if (j.is_discarded()) return skip(SkipReason::BadJson, "not valid JSON");
  return parse_json_value(j, format, vocab_size);
}

bool is_json_array_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  AERIE_CHECK(in, "prepare: cannot open input " << path);
  char c;
  while (in.get(c)) {
    if (c == ' ' || c == '\t' || c == '\r' || c == '\n') continue;
    return c == '[';
  }
  return false;
}

int64_t for_each_array_record(const std::string& path, InputFormat format, int64_t vocab_size, int part, int parts,
                              const std::function<void(InputRecord&&, int64_t)>& fn) {
  std::ifstream in(path, std::ios::binary);
  AERIE_CHECK(in, "prepare: cannot open input " << path);
  json all = chat::parse_json_exact(in);
  AERIE_CHECK(!all.is_discarded() && all.is_array(), "prepare: " << path << " starts with '[' but is not one valid "
                                                                 << "JSON array (use JSONL: one record per line)");
  const int64_t n = static_cast<int64_t>(all.size());
  const int64_t b = n * part / parts, e = n * (part + 1) / parts;
  for (int64_t i = b; i < e; ++i) fn(parse_json_value(all[static_cast<size_t>(i)], format, vocab_size), i);
  return n;
}

InputRecord parse_story(const std::string& story) {
  size_t first = story.find_first_not_of(" \t\r\n");
  if (first == std::string::npos) return skip(SkipReason::Empty, "empty story");
  size_t last = story.find_last_not_of(" \t\r\n");
  std::string s = story.substr(first, last - first + 1);
  for (size_t i = 0; i + 1 < s.size(); ++i) {
    char c = s[i], n = s[i + 1];
    if ((c == '.' || c == '!' || c == '?') && (n == ' ' || n == '\n' || n == '\t' || n == '\r')) {
      size_t rest = s.find_first_not_of(" \t\r\n", i + 1);
      if (rest == std::string::npos) break;
      Conversation conv;
      conv.turns.push_back({ChatRole::User, s.substr(0, i + 1)});
      conv.turns.push_back({ChatRole::Assistant, s.substr(rest)});
      InputRecord r;
      r.conversation = std::move(conv);
      return r;
    }
  }
  return skip(SkipReason::NoRest, "a single sentence, nothing to answer");
}

// ---------------------------------------------------------------------------------------------------
// Byte ranges

namespace {

// Start of the first line at or after byte `pos` (file size if none).
int64_t line_start_at_or_after(std::ifstream& in, int64_t pos, int64_t size) {
  if (pos <= 0) return 0;
  if (pos >= size) return size;
  in.clear();
  in.seekg(pos - 1);
  std::string rest;
  char c;
  if (in.get(c) && c == '\n') return pos;
  std::getline(in, rest);
  int64_t p = pos + static_cast<int64_t>(rest.size()) + 1;  // after the '\n'
  return std::min(p, size);
}

// Text: the start of the first blank line at or after the line start `pos` (file size if none), so that
// a range boundary never falls inside a story.
int64_t blank_line_at_or_after(std::ifstream& in, int64_t pos, int64_t size) {
  if (pos <= 0) return 0;
  in.clear();
  in.seekg(pos);
  std::string line;
  int64_t p = pos;
  while (p < size && std::getline(in, line)) {
    if (is_blank(line)) return p;
    p += static_cast<int64_t>(line.size()) + 1;
  }
  return size;
}

}  // namespace

InputRange input_range(const std::string& path, bool text, int part, int parts) {
  std::ifstream in(path, std::ios::binary);
  AERIE_CHECK(in, "prepare: cannot open input " << path);
  std::error_code ec;
  int64_t size = static_cast<int64_t>(std::filesystem::file_size(path, ec));
  AERIE_CHECK(!ec, "prepare: cannot read the size of " << path << ": " << ec.message());
  auto boundary = [&](int k) -> int64_t {
    if (k <= 0) return 0;
    if (k >= parts) return size;
    int64_t pos = static_cast<int64_t>(static_cast<__int128>(size) * k / parts);
    pos = line_start_at_or_after(in, pos, size);
    return text ? blank_line_at_or_after(in, pos, size) : pos;
  };
  InputRange r;
  r.begin = boundary(part);
  r.end = std::max(r.begin, boundary(part + 1));
  // Count the lines of the range.
  in.clear();
  in.seekg(r.begin);
  std::vector<char> buf(1 << 20);
  int64_t left = r.end - r.begin;
  char lastc = '\n';
  while (left > 0) {
    int64_t n = std::min<int64_t>(left, static_cast<int64_t>(buf.size()));
    in.read(buf.data(), n);
    AERIE_CHECK(in.gcount() == n, "prepare: read error in " << path << " at byte " << (r.end - left));
    r.lines += std::count(buf.begin(), buf.begin() + n, '\n');
    lastc = buf[static_cast<size_t>(n - 1)];
    left -= n;
  }
  if (r.end > r.begin && lastc != '\n') ++r.lines;  // an unterminated last line
  return r;
}

void for_each_record(const std::string& path, const InputRange& range, bool text,
                     const std::function<void(const std::string&, int64_t, int64_t)>& fn) {
  std::ifstream in(path, std::ios::binary);
  AERIE_CHECK(in, "prepare: cannot open input " << path);
  in.seekg(range.begin);
  int64_t pos = range.begin, line_no = 0;
  std::string line, story;
  int64_t story_line = -1;
  while (pos < range.end && std::getline(in, line)) {
    pos += static_cast<int64_t>(line.size()) + (in.eof() ? 0 : 1);
    if (!text) {
      if (!line.empty() && line.back() == '\r') line.pop_back();
      fn(line, line_no, pos - range.begin);
    } else if (is_blank(line)) {
      if (story_line >= 0) fn(story, story_line, pos - range.begin);
      story.clear();
      story_line = -1;
    } else {
      if (!line.empty() && line.back() == '\r') line.pop_back();
      if (story_line < 0) story_line = line_no;
      else story += '\n';
      story += line;
    }
    ++line_no;
  }
  AERIE_CHECK(!in.bad(), "prepare: read error in " << path);
  if (text && story_line >= 0) fn(story, story_line, pos - range.begin);
}

}  // namespace aerie
