#include "data/chat_templates.h"
#include "core/settings.h"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <set>
#include <sstream>

#include "core/error.h"
#include "data/chat_templates_json.h"

namespace aerie {

namespace fs = std::filesystem;
using ojson = nlohmann::ordered_json;

// ---------------------------------------------------------------------------------------------------
// The file

ChatTemplateSpec ChatTemplateSpec::load(const std::string& path) {
  const std::map<std::string, std::string> ini = chat::read_ini(path);
  ChatTemplateSpec s;
  s.path = path;
  s.name = fs::path(path).stem().string();
  std::set<std::string> used;
  auto str = [&](const char* key, std::string& out) {
    auto it = ini.find(key);
    if (it == ini.end()) return;
    out = it->second;
    used.insert(key);
  };
  auto flag = [&](const char* key, bool& out) {
    std::string v;
    str(key, v);
    if (v.empty()) return;
    AERIE_CHECK(v == "true" || v == "false", path << ": " << key << " must be true or false, got '" << v << "'");
    out = v == "true";
  };
  auto integer = [&](const char* key, int& out) {
    std::string v;
    str(key, v);
    if (v.empty()) return;
    try {
      out = std::stoi(v);
    } catch (const std::exception&) {
      AERIE_THROW(path << ": " << key << " must be an integer, got '" << v << "'");
    }
  };
  auto choice = [&](const char* key, std::string& out, std::initializer_list<const char*> allowed) {
    str(key, out);
    for (const char* a : allowed)
      if (out == a) return;
    std::ostringstream os;
    for (const char* a : allowed) os << " " << a;
    AERIE_THROW(path << ": " << key << " = '" << out << "' is not one of" << os.str());
  };
  str("template.description", s.description);
  str("template.bos", s.bos);
  str("template.eot", s.eot);
  std::string specials;
  str("template.special_tokens", specials);
  std::istringstream ss(specials);
  for (std::string t; ss >> t;) s.special_tokens.push_back(t);
  std::string roles;
  str("template.roles", roles);
  std::istringstream rs(roles);
  for (std::string r; rs >> r;) {
    AERIE_CHECK(r == "system" || r == "user" || r == "assistant" || r == "tool",
                path << ": template.roles: unknown role '" << r << "' (system, user, assistant, tool)");
    s.roles.push_back(r);
  }
  flag("template.dummy_prefix", s.dummy_prefix);
  flag("template.merge_consecutive", s.merge_consecutive);
  str("template.generation_prompt", s.generation_prompt);
  flag("template.no_generation_prompt_after_tool", s.no_generation_prompt_after_tool);
  for (auto [sec, role] : {std::pair<std::string, Role*>{"system", &s.system}, {"user", &s.user},
                           {"assistant", &s.assistant}, {"tool", &s.tool}}) {
    str((sec + ".prefix").c_str(), role->prefix);
    str((sec + ".suffix").c_str(), role->suffix);
    flag((sec + ".trim").c_str(), role->trim);
  }
  choice("system.mode", s.system_mode, {"turn", "first", "all"});
  choice("system.placement", s.system_placement, {"turn", "bare", "first_user", "last_user"});
  str("system.default", s.system_default);
  flag("system.always", s.system_always);
  str("system.join", s.system_join);
  str("system.fold", s.system_fold);
  str("system.preamble", s.system_preamble);
  str("system.tools_preamble", s.system_tools_preamble);
  str("assistant.prefix_after_tool", s.assistant_prefix_after_tool);
  str("assistant.content_prefix", s.assistant_content_prefix);
  choice("tool.content", s.tool_content, {"raw", "json", "mistral", "mistral_common"});
  str("tool.group_prefix", s.tool_group_prefix);
  str("tool.group_suffix", s.tool_group_suffix);
  str("tool.first_prefix", s.tool_first_prefix);
  str("tool.conversation_end", s.tool_conversation_end);
  str("tool_call.format", s.call_format);
  choice("tool_call.arguments", s.call_arguments, {"raw", "json", "normalized"});
  str("tool_call.separator", s.call_separator);
  str("tool_call.begin", s.call_begin);
  str("tool_call.end", s.call_end);
  str("tool_call.after_content", s.call_after_content);
  choice("tool_call.with_content", s.call_with_content, {"keep", "drop_content", "drop_calls", "error"});
  integer("tool_call.max", s.call_max);
  str("tool_call.default_id", s.call_default_id);
  choice("tools.placement", s.tools_placement, {"none", "system", "first_user", "before_last_user", "start"});
  choice("tools.format", s.tools_format, {"each", "list"});
  str("tools.prefix", s.tools_prefix);
  str("tools.suffix", s.tools_suffix);
  str("tools.item_prefix", s.tools_item_prefix);
  str("tools.item_suffix", s.tools_item_suffix);
  str("tools.after_system", s.tools_after_system);
  integer("tools.indent", s.tools_indent);
  flag("tools.sort_keys", s.tools_sort_keys);
  choice("reasoning.mode", s.reasoning, {"none", "qwen3", "kimi"});
  str("reasoning.begin", s.think_begin);
  str("reasoning.end", s.think_end);
  flag("reasoning.empty_think_trained", s.empty_think_trained);
  for (const auto& [key, value] : ini)
    AERIE_CHECK(used.count(key), path << ": unknown key '" << key << "' (keys: docs/preparing-data.md)");
  AERIE_CHECK(!s.eot.empty(), path << ": template.eot (the end-of-turn token) is required");
  return s;
}

std::string find_chat_template(const std::string& name) {
  std::error_code ec;
  if ((name.find('/') != std::string::npos || (name.size() > 4 && name.substr(name.size() - 4) == ".ini")) &&
      fs::is_regular_file(name, ec))
    return name;
  std::vector<std::string> dirs;
  if (!settings().template_dir.empty()) dirs.push_back(settings().template_dir);
#ifdef AERIE_TEMPLATE_DIR
  dirs.push_back(AERIE_TEMPLATE_DIR);
#endif
  char exe[4096];
  const ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  if (n > 0) dirs.push_back((fs::path(std::string(exe, static_cast<size_t>(n))).parent_path().parent_path() /
                             "configs" / "templates").string());
  dirs.push_back("configs/templates");
  std::ostringstream tried;
  std::vector<std::string> seen;  // the build's and the executable's folders are often one (listed once)
  for (const std::string& d : dirs) {
    std::error_code cec;
    std::string canon = fs::weakly_canonical(fs::absolute(d, cec), cec).string();
    if (cec || canon.empty()) canon = d;
    if (std::find(seen.begin(), seen.end(), canon) != seen.end()) continue;
    seen.push_back(canon);
    const fs::path p = fs::path(d) / (name + ".ini");
    if (fs::is_regular_file(p, ec)) return p.string();
    tried << " " << d;
  }
  AERIE_THROW("unknown chat template '" << name << "': no " << name << ".ini in" << tried.str()
                                        << " (built in: plain; or give the path of an .ini file)");
}

// ---------------------------------------------------------------------------------------------------
// Rendering

namespace {

// Collects pieces; template text is split at the template's special tokens.
struct Out {
  const std::vector<std::string>& specials;
  std::vector<TemplatePiece> pieces;

  void text(const std::string& t, bool trained) {
    if (t.empty()) return;
    if (!pieces.empty() && !pieces.back().special && pieces.back().ids.empty() && pieces.back().trained == trained) {
      pieces.back().text += t;
    } else {
      pieces.push_back({t, false, trained, {}});
    }
  }
  void special(const std::string& t, bool trained) { pieces.push_back({t, true, trained, {}}); }
  // Text whose ids are given (a regenerated response): never merged with its neighbours.
  void ids(const std::string& t, const std::vector<int32_t>& v, bool trained) { pieces.push_back({t, false, trained, v}); }
  // Template text: special tokens become special pieces.
  void tpl(const std::string& t, bool trained = false) {
    size_t i = 0;
    while (i < t.size()) {
      size_t best = std::string::npos, len = 0;
      for (const std::string& s : specials) {
        size_t p = t.find(s, i);
        if (p != std::string::npos && (p < best || (p == best && s.size() > len))) best = p, len = s.size();
      }
      if (best == std::string::npos) {
        text(t.substr(i), trained);
        return;
      }
      text(t.substr(i, best - i), trained);
      special(t.substr(best, len), trained);
      i = best + len;
    }
  }
};

std::string replace_all(std::string s, const std::string& from, const std::string& to) {
  for (size_t p = 0; (p = s.find(from, p)) != std::string::npos; p += to.size()) s.replace(p, from.size(), to);
  return s;
}

bool starts_with(const std::string& s, const std::string& p) { return s.compare(0, p.size(), p) == 0; }
bool ends_with(const std::string& s, const std::string& p) {
  return s.size() >= p.size() && s.compare(s.size() - p.size(), p.size(), p) == 0;
}

// Mistral's tool result: {"content": <the text as a number if Python's int()/float() reads it back to the
// same text, else the text>, "call_id": id} (v3_spm.jinja).
// mistral_common: mistral-common's form instead, the text parsed as JSON where it is JSON.
std::string mistral_tool_result(const ChatTurn& t, bool mistral_common) {
  ojson o = ojson::object();
  const std::string& c = t.text;
  ojson content = c;
  if (mistral_common) {
    ojson parsed = chat::parse_json_exact(c);
    if (!parsed.is_discarded()) content = parsed;
    o["content"] = content;
    o["call_id"] = t.tool_call_id;
    return chat::python_json(o);
  }
  // Python's str(int(c)) == c: optional '-', then "0" or digits without a leading zero; not "-0".
  const std::string digits = !c.empty() && c[0] == '-' ? c.substr(1) : c;
  const bool is_int = !digits.empty() && digits.find_first_not_of("0123456789") == std::string::npos &&
                      (digits == "0" ? c == "0" : digits[0] != '0');
  if (is_int) {
    content = chat::exact_integer(c);  // Python's int: any size
  } else if (!c.empty() && c.find_first_not_of("-+.0123456789eE") == std::string::npos) {
    char* end = nullptr;
    const double v = std::strtod(c.c_str(), &end);
    if (end == c.c_str() + c.size() && chat::python_json(ojson(v)) == c) content = v;
  }
  o["content"] = content;
  o["call_id"] = t.tool_call_id;
  return chat::python_json(o);
}

}  // namespace

ConfigChatTemplate::ConfigChatTemplate(ChatTemplateSpec spec, const Tokenizer* tokenizer) : spec_(std::move(spec)) {
  if (!spec_.bos.empty()) spec_.special_tokens.push_back(spec_.bos);
  spec_.special_tokens.push_back(spec_.eot);
  if (!tokenizer) return;
  for (const std::string& s : spec_.special_tokens) {
    const int32_t id = tokenizer->token_to_id(s);
    AERIE_CHECK(id >= 0, spec_.path << ": special token '" << s << "' of chat template '" << spec_.name
                                    << "' is not in the tokenizer");
    special_ids_[s] = id;
  }
}

namespace {

// One conversation rendered by a ConfigChatTemplate's spec (ConfigChatTemplate::render_pieces): the
// messages merged, the system prompt and the tool definitions placed, then each message by its role, as the
// model's Jinja template renders them.
struct SpecRenderer {
  explicit SpecRenderer(const ChatTemplateSpec& spec) : s(spec), out{spec.special_tokens, {}} {}
  std::vector<TemplatePiece> render(const Conversation& conversation, bool generation_prompt);

  static std::string role_text(const ChatTemplateSpec::Role& r, const std::string& t) {
    return r.trim ? chat::py_strip(t) : t;
  }
  std::vector<ChatTurn> merged_turns(const Conversation& conversation) const;
  void split_system(const std::vector<ChatTurn>& turns);
  void make_tools(const Conversation& conversation);
  void render_start();
  void find_indices();
  void render_system(const ChatTurn& t);
  void render_user(const ChatTurn& t, int i);
  void render_tool(const ChatTurn& t, int i, ChatRole prev);
  void render_assistant(const ChatTurn& t, int i, ChatRole prev);
  std::string qwen3_reasoning(const ChatTurn& t, int i, std::string content);
  std::string kimi_reasoning(const ChatTurn& t, int i, std::string content);
  void render_calls(const std::vector<ToolCall>& calls, const std::string& content, int i);

  const ChatTemplateSpec& s;
  Out out;
  std::string system;  // the system prompt (has_system: there is one)
  bool has_system = false;
  std::vector<ChatTurn> loop;  // the messages rendered in turn (the system prompt's taken out by its mode)
  std::string tools;           // the tool definitions' text (prefix + JSON + suffix; empty: none)
  bool has_tools = false;
  // Indices the rules need.
  int n = 0, first_user = -1, last_user = -1, last_query = -1, last_assistant = -1;
  int last_answer = -1;  // Kimi-K2-Thinking: the last assistant message without tool calls
  bool first_tool_result = true;
  std::vector<std::string> call_ids;  // the ids of the last assistant message's calls (default_id), for their
  std::vector<bool> call_answered;    // results; and which a result has answered
  int call_count = 0;                 // calls so far in the conversation
};

std::vector<TemplatePiece> SpecRenderer::render(const Conversation& conversation, bool generation_prompt) {
  split_system(merged_turns(conversation));
  make_tools(conversation);
  render_start();
  find_indices();
  for (int i = 0; i < n; ++i) {
    const ChatTurn& t = loop[i];
    const ChatRole prev = i > 0 ? loop[i - 1].role : ChatRole::System;
    switch (t.role) {
      case ChatRole::System:
        render_system(t);
        break;
      case ChatRole::User:
        render_user(t, i);
        break;
      case ChatRole::Tool:
        render_tool(t, i, prev);
        break;
      case ChatRole::Assistant:
        render_assistant(t, i, prev);
        break;
    }
  }
  if (generation_prompt && !(s.no_generation_prompt_after_tool && n > 0 && loop[n - 1].role == ChatRole::Tool))
    out.tpl(s.generation_prompt);
  return out.pieces;
}

// Messages: consecutive user / assistant messages merged where the template does (Mistral).
std::vector<ChatTurn> SpecRenderer::merged_turns(const Conversation& conversation) const {
  std::vector<ChatTurn> turns;
  for (const ChatTurn& t : conversation.turns) {
    AERIE_CHECK(s.roles.empty() || std::find(s.roles.begin(), s.roles.end(), role_name(t.role)) != s.roles.end(),
                "chat template " << s.name << " does not render " << role_name(t.role) << " messages");
    if (s.merge_consecutive && !turns.empty() && turns.back().role == t.role &&
        (t.role == ChatRole::User || t.role == ChatRole::Assistant)) {
      ChatTurn& b = turns.back();
      if (!t.content_null) {
        b.text = b.content_null ? t.text : b.text + "\n\n" + t.text;
        b.content_null = false;
      }
      b.tool_calls.insert(b.tool_calls.end(), t.tool_calls.begin(), t.tool_calls.end());
      continue;
    }
    turns.push_back(t);
  }
  return turns;
}

// The system prompt.
void SpecRenderer::split_system(const std::vector<ChatTurn>& turns) {
  if (s.system_mode == "all") {
    for (const ChatTurn& t : turns) {
      if (t.role != ChatRole::System) {
        loop.push_back(t);
        continue;
      }
      system = has_system ? system + s.system_join + t.text : t.text;
      has_system = true;
    }
  } else if (s.system_mode == "first" && !turns.empty() && turns[0].role == ChatRole::System) {
    system = turns[0].text;
    has_system = true;
    loop.assign(turns.begin() + 1, turns.end());
  } else {
    loop = turns;
  }
  if (!has_system && !s.system_default.empty()) {
    system = s.system_default;
    has_system = true;
  }
  if (has_system && s.system.trim) system = chat::py_strip(system);
}

// Tool definitions.
void SpecRenderer::make_tools(const Conversation& conversation) {
  if (!conversation.tools_json.empty() && s.tools_placement != "none") {
    ojson defs = chat::parse_json_exact(conversation.tools_json);
    if (s.tools_sort_keys && !defs.is_discarded())  // nlohmann::json keeps keys in std::map (sorted) order
      defs = ojson(nlohmann::json(defs));
    AERIE_CHECK(defs.is_array(), "chat template " << s.name << ": the conversation's tools are not a JSON array");
    if (!defs.empty()) {
      tools = s.tools_prefix;
      if (s.tools_format == "list") {
        tools += s.tools_item_prefix + chat::python_json(defs, s.tools_indent) + s.tools_item_suffix;
      } else {
        for (const ojson& d : defs) tools += s.tools_item_prefix + chat::python_json(d, s.tools_indent) + s.tools_item_suffix;
      }
      tools += s.tools_suffix;
    }
  }
  has_tools = !tools.empty();
}

// The conversation's start: BOS, tool definitions placed at the start, and the system turn.
void SpecRenderer::render_start() {
  if (!s.bos.empty()) out.special(s.bos, false);
  if (has_tools && s.tools_placement == "start") {  // tools = prefix + JSON + suffix: the JSON is text
    out.tpl(s.tools_prefix);
    out.text(tools.substr(s.tools_prefix.size(), tools.size() - s.tools_prefix.size() - s.tools_suffix.size()), false);
    out.tpl(s.tools_suffix);
  }
  if (s.system_mode != "turn" || s.system_placement != "turn") {
    if (s.system_placement == "turn" &&
        (has_system || s.system_always || (has_tools && s.tools_placement == "system"))) {
      std::string body = system;
      if (has_tools && s.tools_placement == "system")
        body = (body.empty() ? "" : body + s.tools_after_system) + tools;
      out.tpl(s.system.prefix);
      if (has_tools) out.tpl(s.system_tools_preamble);
      out.tpl(s.system_preamble);
      out.text(body, false);
      out.tpl(s.system.suffix);
    } else if (s.system_placement == "bare" && has_system) {
      out.text(system, false);
    }
  }
}

// Indices the rules need.
void SpecRenderer::find_indices() {
  n = static_cast<int>(loop.size());
  last_query = n - 1;
  for (int i = 0; i < n; ++i)
    if (loop[i].role == ChatRole::User) {
      if (first_user < 0) first_user = i;
      last_user = i;
    }
  for (int i = 0; i < n; ++i)
    if (loop[i].role == ChatRole::Assistant) last_assistant = i;
  for (int i = n - 1; i >= 0 && last_answer < 0; --i)
    if (loop[i].role == ChatRole::Assistant && loop[i].tool_calls.empty()) last_answer = i;
  for (int i = n - 1; i >= 0; --i) {  // Qwen3: the last user message that is not a wrapped tool response
    const std::string& t = loop[i].text;
    if (loop[i].role == ChatRole::User && !(starts_with(t, "<tool_response>") && ends_with(t, "</tool_response>"))) {
      last_query = i;
      break;
    }
  }
}

void SpecRenderer::render_system(const ChatTurn& t) {
  out.tpl(s.system.prefix);
  out.text(role_text(s.system, t.text), false);
  out.tpl(s.system.suffix);
}

void SpecRenderer::render_user(const ChatTurn& t, int i) {
  std::string text = role_text(s.user, t.text);
  if (has_system && ((s.system_placement == "first_user" && i == first_user) ||
                     (s.system_placement == "last_user" && i == last_user)) && !system.empty())
    text = system + s.system_fold + text;
  if (has_tools && s.tools_placement == "first_user" && i == first_user) text = tools + text;
  if (has_tools && s.tools_placement == "before_last_user" && i == last_user) {
    // tools = prefix + JSON + suffix: the JSON is text, prefix/suffix template text
    out.tpl(s.tools_prefix);
    out.text(tools.substr(s.tools_prefix.size(), tools.size() - s.tools_prefix.size() - s.tools_suffix.size()), false);
    out.tpl(s.tools_suffix);
  }
  out.tpl(s.user.prefix);
  out.text(text, false);
  out.tpl(s.user.suffix);
}

void SpecRenderer::render_tool(const ChatTurn& t, int i, ChatRole prev) {
  const bool group_start = i == 0 || prev != ChatRole::Tool;
  const bool group_end = i + 1 == n || loop[i + 1].role != ChatRole::Tool;
  if (group_start) out.tpl(s.tool_group_prefix);
  // Without a tool_call_id (default_id set): the id of the first call of the assistant turn before it
  // that no result answers yet (calls that a result of the group names were set aside at that turn).
  std::string id = t.tool_call_id;
  for (size_t k = 0; k < call_ids.size() && id.empty(); ++k)
    if (!call_answered[k]) {
      id = call_ids[k];
      call_answered[k] = true;
    }
  std::string prefix = first_tool_result && !s.tool_first_prefix.empty() ? s.tool_first_prefix : s.tool.prefix;
  prefix = replace_all(replace_all(prefix, "$id", id), "$name", t.name.empty() ? "tool" : t.name);
  out.tpl(prefix);
  first_tool_result = false;
  std::string text = role_text(s.tool, t.text);
  if (s.tool_content == "json") text = chat::python_json(ojson(text));
  else if (s.tool_content == "mistral" || s.tool_content == "mistral_common")
    text = mistral_tool_result(t, s.tool_content == "mistral_common");
  out.text(text, false);
  out.tpl(s.tool.suffix);
  if (group_end) out.tpl(s.tool_group_suffix);
  if (i + 1 == n) out.tpl(s.tool_conversation_end);
}

void SpecRenderer::render_assistant(const ChatTurn& t, int i, ChatRole prev) {
  call_ids.clear();  // results after this turn answer its calls, not an earlier turn's
  call_answered.clear();
  out.tpl(prev == ChatRole::Tool && i > 0 && !s.assistant_prefix_after_tool.empty() ? s.assistant_prefix_after_tool
                                                                                     : s.assistant.prefix);
  std::string content = t.text;
  if (s.reasoning == "qwen3") content = qwen3_reasoning(t, i, std::move(content));
  if (s.reasoning == "kimi") content = kimi_reasoning(t, i, std::move(content));
  content = role_text(s.assistant, content);
  std::vector<ToolCall> calls = s.call_format.empty() ? std::vector<ToolCall>{} : t.tool_calls;
  if (t.text_is_tool_calls && !calls.empty()) content.clear();  // the calls in the template's syntax
  if (!calls.empty() && !content.empty()) {
    if (s.call_with_content == "drop_content") content.clear();
    else if (s.call_with_content == "drop_calls") calls.clear();
    else if (s.call_with_content == "error")
      AERIE_THROW("chat template " << s.name << ": an assistant message has both content and tool calls");
  }
  AERIE_CHECK(s.call_max <= 0 || static_cast<int>(calls.size()) <= s.call_max,
              "chat template " << s.name << ": " << calls.size() << " tool calls in one message (at most "
                               << s.call_max << ")");
  // A regenerated response's own ids replace its text where the template renders the text unchanged.
  const bool own_ids = !t.ids.empty() && calls.empty() && s.assistant_content_prefix.empty() && content == t.text;
  if (own_ids) out.ids(content, t.ids, true);
  else if (!content.empty() || calls.empty()) out.text(s.assistant_content_prefix + content, true);
  if (!calls.empty()) render_calls(calls, content, i);
  out.special(s.eot, !t.unfinished);
  out.tpl(s.assistant.suffix);
}

// Qwen3: the reasoning (reasoning_content, or a think block parsed out of the content) rendered as a think
// block for the turns after the last query; returns the content.
std::string SpecRenderer::qwen3_reasoning(const ChatTurn& t, int i, std::string content) {
  std::string reasoning = t.reasoning;
  if (!t.has_reasoning) {
    const size_t close = content.rfind("</think>");
    if (close != std::string::npos) {
      std::string before = chat::strip_chars(content.substr(0, content.find("</think>")), "\n", false, true);
      const size_t open = before.rfind("<think>");
      if (open != std::string::npos) before = before.substr(open + 7);
      reasoning = chat::strip_chars(before, "\n", true, false);
      content = chat::strip_chars(content.substr(close + 8), "\n", true, false);
    }
  }
  if (i > last_query && (i + 1 == n || !reasoning.empty())) {
    const std::string r = chat::strip_chars(reasoning, "\n", true, true);
    out.tpl(s.think_begin + r + s.think_end, !r.empty() || s.empty_think_trained);
    content = chat::strip_chars(content, "\n", true, false);
  }
  return content;
}

// Kimi-K2-Thinking: the think block of each assistant turn (below); returns the content.
std::string SpecRenderer::kimi_reasoning(const ChatTurn& t, int i, std::string content) {
  // The Jinja keeps reasoning_content only in the turns after the last answer (a tool-call chain under
  // way) and renders every earlier turn, the final answer included, with an empty think block: the
  // history a served model is given. The conversation's final answer is instead trained as the model
  // writes it after the generation prompt: <think>REASONING</think>ANSWER (as Qwen3's Jinja does for its
  // last turn), and an answer of aerie generate as its ids alone (the whole turn as the target wrote it,
  // think block and all, or none where it wrote none). A think block the content starts with (after
  // whitespace) is parsed out of it; a non-empty reasoning_content wins over it (one block either way).
  std::string reasoning = t.reasoning;
  const size_t lead = content.find_first_not_of(" \t\r\n");
  if (lead != std::string::npos && content.compare(lead, s.think_begin.size(), s.think_begin) == 0) {
    const size_t close = content.find(s.think_end, lead + s.think_begin.size());
    if (close != std::string::npos) {
      if (reasoning.empty())
        reasoning = content.substr(lead + s.think_begin.size(), close - lead - s.think_begin.size());
      content = content.substr(close + s.think_end.size());
    }
  }
  // The final answer: no user turn and no other assistant turn after it (a tool-call turn after it was
  // generated with the answer's history form in its prompt).
  const bool final_answer = i == last_answer && i > last_user && i == last_assistant;
  if (final_answer && !t.ids.empty() && t.reasoning.empty())
    content = t.text;  // no think block of the template's: the own-ids branch below renders the ids
  else
    out.tpl(s.think_begin + (i > last_answer || final_answer ? reasoning : std::string()) + s.think_end, true);
  return content;
}

// The tool calls of assistant turn i in the template's syntax (after its `content`, if any).
void SpecRenderer::render_calls(const std::vector<ToolCall>& calls, const std::string& content, int i) {
  if (!content.empty()) out.tpl(s.call_after_content, true);
  out.tpl(s.call_begin, true);
  for (size_t k = 0; k < calls.size(); ++k) {
    const ToolCall& c = calls[k];
    std::string args = c.arguments;
    if (s.call_arguments == "json" && c.arguments_is_string) args = chat::python_json(ojson(args));
    if (s.call_arguments == "normalized" && c.arguments_is_string) {
      const ojson parsed = chat::parse_json_exact(args);
      if (!parsed.is_discarded()) args = chat::python_json(parsed);
    }
    if (args.empty()) args = "{}";
    std::string id = c.id;
    if (!s.call_default_id.empty()) {
      const std::string dflt = replace_all(replace_all(replace_all(s.call_default_id, "$name", c.name), "$index",
                                                       std::to_string(k)), "$count", std::to_string(call_count));
      if (id.empty()) id = dflt;
      // what a result answering it names: the id the call is written with ($id), else the default's
      call_ids.push_back(s.call_format.find("$id") != std::string::npos ? id : dflt);
      // a call that a result after this turn names explicitly is that result's, not a nameless one's
      bool named = false;
      for (int j = i + 1; j < n && loop[j].role == ChatRole::Tool && !named; ++j)
        named = !loop[j].tool_call_id.empty() && loop[j].tool_call_id == call_ids.back();
      call_answered.push_back(named);
    }
    ++call_count;
    std::string one = replace_all(s.call_format, "$name", c.name);
    one = replace_all(one, "$id", id);
    one = replace_all(one, "$index", std::to_string(k));
    one = replace_all(one, "$arguments", args);  // last: the arguments may hold "$name"
    if (k > 0) out.tpl(s.call_separator, true);
    out.tpl(one, true);
  }
  out.tpl(s.call_end, true);
}

}  // namespace

std::vector<TemplatePiece> ConfigChatTemplate::render_pieces(const Conversation& conversation,
                                                             bool generation_prompt) const {
  return SpecRenderer(spec_).render(conversation, generation_prompt);
}

std::vector<TemplateSegment> ConfigChatTemplate::to_segments(const std::vector<TemplatePiece>& pieces) const {
  AERIE_CHECK(!special_ids_.empty() || pieces.empty() || std::none_of(pieces.begin(), pieces.end(), [](const auto& p) {
                return p.special;
              }),
              "chat template " << spec_.name << " was made without a tokenizer: use render_pieces");
  std::vector<TemplateSegment> segs;
  for (const TemplatePiece& p : pieces) {
    if (p.special) segs.push_back({p.text, {special_ids_.at(p.text)}, p.trained});
    else segs.push_back({p.text, p.ids, p.trained});
  }
  return segs;
}

std::vector<TemplateSegment> ConfigChatTemplate::render(const Conversation& conversation) const {
  return to_segments(render_pieces(conversation, false));
}

std::vector<TemplateSegment> ConfigChatTemplate::render_prompt(const Conversation& conversation) const {
  return to_segments(render_pieces(conversation, true));
}

std::vector<int32_t> ConfigChatTemplate::encode_text(const std::string& text, const Tokenizer& tokenizer) const {
  if (spec_.dummy_prefix && !text.empty() && text[0] == ' ') return tokenizer.encode(text.substr(1));
  return tokenizer.encode(text);
}

std::string pieces_text(const std::vector<TemplatePiece>& pieces) {
  std::string t;
  for (const TemplatePiece& p : pieces) t += p.text;
  return t;
}

std::vector<std::pair<size_t, size_t>> trained_spans(const std::vector<TemplatePiece>& pieces) {
  std::vector<std::pair<size_t, size_t>> spans;
  size_t pos = 0;
  for (const TemplatePiece& p : pieces) {
    const size_t end = pos + p.text.size();
    if (p.trained && !p.text.empty()) {
      if (!spans.empty() && spans.back().second == pos) spans.back().second = end;
      else spans.emplace_back(pos, end);
    }
    pos = end;
  }
  return spans;
}

}  // namespace aerie
