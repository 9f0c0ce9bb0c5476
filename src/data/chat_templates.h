// Chat templates described by INI files (configs/templates/<name>.ini): one renderer whose strings and rules
// come from the file, so a new model usually needs a new file, not new code. docs/preparing-data.md lists
// every key and how to check a new template against the model's Jinja template (tools/reference/
// chat_template_golden.py).
//
// Rendering produces pieces: template text (role headers, separators), special tokens named in the file
// (turned into their ids), and message text, each marked trained or not. Trained (loss mask 1, eagle3.md
// section 1) is exactly what the model generates in an assistant turn: its think block (when the model writes
// it), content, tool calls, and the end-of-turn token that closes the turn. Role headers, system prompts,
// user text, tool definitions and tool results are never trained.
#pragma once
#include <map>
#include <string>
#include <vector>

#include "data/prepare_template.h"

namespace aerie {

/// The contents of one template file (key names in brackets; strings may be quoted to keep blanks and use
/// \n, \t, \uXXXX escapes). Defaults are the empty string / false unless noted.
struct ChatTemplateSpec {
  struct Role {
    std::string prefix, suffix;  // [<role>] prefix, suffix: text before / after the message text ([tool]
                                 // prefix: $id = the result's tool_call_id, $name = its name, else "tool")
    bool trim = false;           // [<role>] trim: the message text is Python-strip()ped (Jinja `| trim`)
  };
  std::string name, path, description;  // name: the file's stem
  std::string bos;                      // [template] bos: special token rendered first (empty: none)
  std::string eot;                      // [template] eot: closes every assistant turn (trained)
  std::vector<std::string> special_tokens;  // [template] special_tokens: blank-separated; rendered as ids
  bool dummy_prefix = false;            // [template] dummy_prefix: sentencepiece tokenizers (Mistral): every
                                        // text piece is encoded alone and its leading space is the "▁" the
                                        // tokenizer prepends itself (mistral-common's per-message encoding)
  bool merge_consecutive = false;       // [template] merge_consecutive: consecutive user (or assistant) messages
                                        // become one, texts joined by "\n\n" (Mistral)
  std::string generation_prompt;        // [template] generation_prompt: appended by render_prompt
  bool no_generation_prompt_after_tool = false;  // [template] no_generation_prompt_after_tool: none when the
                                                 // conversation ends with tool results (DeepSeek-V3)
  std::vector<std::string> roles;       // [template] roles: the roles the template renders (blank-separated;
                                        // empty: all); a message of another role is an error (Mistral v1: tool)
  Role system, user, assistant, tool;
  // [system]
  std::string system_mode = "turn";     // mode: turn (every system message is a turn where it stands) | first
                                        // (only a leading one is the system prompt) | all (all are joined)
  std::string system_placement = "turn";  // placement: turn | bare (text alone after bos) | first_user |
                                          // last_user (folded into that user message: system + fold + text)
  std::string system_default;           // default: the system prompt when the conversation has none
  bool system_always = false;           // always: render the system turn even without a system prompt
  std::string system_join = "\n\n";     // join: separator of several system messages (mode all)
  std::string system_fold = "\n\n";     // fold: between the system prompt and the user text it is folded into
  std::string system_preamble;          // preamble: text after system.prefix, before the prompt
  std::string system_tools_preamble;    // tools_preamble: before the preamble when the conversation has tools
  // [assistant]
  std::string assistant_prefix_after_tool;  // prefix_after_tool: header of an assistant turn after tool results
  std::string assistant_content_prefix;     // content_prefix: trained text before the content (Mistral's " ")
  // [tool] (tool results)
  std::string tool_content = "raw";     // content: raw | json (tojson of the text) | mistral ({"content", "call_id"},
                                        // content a number where Python's int()/float() reads the text back, as
                                        // v3_spm.jinja does) | mistral_common (content parsed where it is JSON)
  std::string tool_group_prefix, tool_group_suffix;  // group_prefix, group_suffix: around a run of results
  std::string tool_first_prefix;        // first_prefix: prefix of the conversation's first result (DeepSeek)
  std::string tool_conversation_end;    // conversation_end: after results that end the conversation
  // [tool_call] (assistant tool calls; format empty: tool calls are not rendered)
  std::string call_format;              // format: one call, with $name, $arguments, $id and $index (the
                                        // call's 0-based position in its message, Kimi-K2) substituted
  std::string call_arguments = "raw";   // arguments: raw (strings verbatim, objects as JSON) | json (tojson) |
                                        // normalized (strings that are JSON re-written as Python's json.dumps)
  std::string call_separator, call_begin, call_end;  // separator, begin, end: around the list of calls
  std::string call_after_content;       // after_content: between non-empty content and the calls
  std::string call_with_content = "keep";  // with_content: keep | drop_content | drop_calls | error
  int call_max = 0;                     // max: more calls in one message is an error (0: no limit)
  std::string call_default_id;          // default_id: the id of a call that has none (ShareGPT function_call
                                        // turns), with $name, $index and $count (the calls before it in the
                                        // conversation); a tool result without tool_call_id then gets the id
                                        // of the first call of the turn before it that no result answers (nor
                                        // names). Empty: ids stay as given
  // [tools] (tool definitions, the record's "tools")
  std::string tools_placement = "none";  // placement: none | system | first_user | before_last_user | start
                                         // (a block of its own first, after bos: Kimi-K2's tool_declare)
  std::string tools_format = "each";     // format: each (item_prefix + tojson(tool) + item_suffix) | list
  std::string tools_prefix, tools_suffix, tools_item_prefix, tools_item_suffix;
  std::string tools_after_system;        // after_system: between a system prompt and the tool block
  int tools_indent = -1;                 // indent: tojson indent (-1: one line)
  bool tools_sort_keys = false;          // sort_keys: object keys sorted at every level (Kimi's
                                         // tokenization_kimi.py deep_sort_dict(tools) before the template)
  // [reasoning]
  std::string reasoning = "none";        // mode: none | qwen3 (think blocks as Qwen3's template renders them)
                                         // | kimi (K2-Thinking: begin + end, empty, on every assistant turn up
                                         // to the last one without tool calls; begin + reasoning + end after it)
  std::string think_begin = "<think>\n", think_end = "\n</think>\n\n";  // begin, end
  bool empty_think_trained = true;       // empty_think_trained: false when the server puts the empty think
                                         // block into the prompt (Qwen3 with enable_thinking=False)

  /// Reads an INI file. Throws aerie::Error naming the file on an unknown key or a bad value.
  static ChatTemplateSpec load(const std::string& path);
};

/// One rendered piece: `special` text is one special token of the template.
struct TemplatePiece {
  std::string text;
  bool special = false;
  bool trained = false;
  std::vector<int32_t> ids;  // non-empty: these ids, not the tokenized text (a regenerated response)
};

/// The INI-described template. With a tokenizer, render() maps the special tokens to ids (a token missing
/// from the tokenizer is an error at construction, naming the file); without one (nullptr) only
/// render_pieces() may be used.
class ConfigChatTemplate : public ChatTemplate {
 public:
  ConfigChatTemplate(ChatTemplateSpec spec, const Tokenizer* tokenizer);
  std::string name() const override { return spec_.name; }
  std::vector<TemplateSegment> render(const Conversation& conversation) const override;
  std::vector<TemplateSegment> render_prompt(const Conversation& conversation) const override;
  std::vector<int32_t> encode_text(const std::string& text, const Tokenizer& tokenizer) const override;

  /// The pieces of `conversation` in order (adjacent text pieces of equal `trained` merged). Throws
  /// aerie::Error where the model's own template refuses the conversation (e.g. more tool calls than
  /// [tool_call] max, content with tool calls under with_content = error).
  std::vector<TemplatePiece> render_pieces(const Conversation& conversation, bool generation_prompt = false) const;
  const ChatTemplateSpec& spec() const { return spec_; }

 private:
  std::vector<TemplateSegment> to_segments(const std::vector<TemplatePiece>& pieces) const;
  ChatTemplateSpec spec_;
  std::map<std::string, int32_t> special_ids_;
};

/// The text of `pieces` (concatenated) and the [begin, end) byte ranges of its trained pieces, adjacent ones
/// joined.
std::string pieces_text(const std::vector<TemplatePiece>& pieces);
std::vector<std::pair<size_t, size_t>> trained_spans(const std::vector<TemplatePiece>& pieces);

/// The file of template `name`: `name` itself if it is an existing file (a path), else `<dir>/<name>.ini` for
/// the first dir of: $AERIE_TEMPLATE_DIR, the source tree's configs/templates (compiled in), configs/templates
/// beside the executable's parent folder, ./configs/templates. Throws aerie::Error listing the folders tried.
std::string find_chat_template(const std::string& name);

}  // namespace aerie
