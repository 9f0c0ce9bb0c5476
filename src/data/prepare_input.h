// Input records of `aerie prepare`: one conversation (or one pre-tokenized sample) per JSONL line, or one
// story per blank-line-separated block of a plain text file. Parsing never throws on bad input: a record
// that cannot be used comes back with a SkipReason, counted and reported by the job.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace aerie {

enum class ChatRole : uint8_t { System, User, Assistant, Tool };
const char* role_name(ChatRole r);

/// One tool call of an assistant turn (OpenAI "tool_calls": [{"id", "type": "function", "function": {"name",
/// "arguments"}}]).
struct ToolCall {
  std::string id;
  std::string name;
  /// The arguments as JSON text: verbatim when the record gives a string (OpenAI's form), else the object
  /// written as Python's json.dumps writes it (chat::python_json, key order kept).
  std::string arguments;
  bool arguments_is_string = false;
};

/// One message. `text` is the content ("" when absent or null). Assistant turns may carry `reasoning`
/// (reasoning_content) and `tool_calls`; tool turns (results) `tool_call_id` and `name`.
struct ChatTurn {
  ChatTurn() = default;
  ChatTurn(ChatRole r, std::string t) : role(r), text(std::move(t)) {}
  ChatRole role = ChatRole::User;
  std::string text;
  std::string reasoning;              // reasoning_content (or "reasoning" / "thinking"); see has_reasoning
  bool has_reasoning = false;         // the record has a non-null reasoning field (even an empty one)
  bool content_null = false;          // "content" absent or null (an assistant turn of tool calls only)
  std::vector<ToolCall> tool_calls;   // assistant
  bool text_is_tool_calls = false;    // ShareGPT "function_call": `text` is the JSON the calls were read from
                                      // (templates without a tool-call syntax render it as the content)
  std::string tool_call_id;           // tool result: the id of the call it answers
  std::string name;                   // tool result: the function's name
};

/// One conversation: turns in order, and the tool definitions offered to the model (OpenAI "tools": a JSON
/// array of {"type": "function", "function": {...}}, kept as JSON text with its key order; "" if none).
struct Conversation {
  std::vector<ChatTurn> turns;
  std::string tools_json;
};

/// Input forms (--format). Auto: ".txt" files are Text; JSONL lines are recognised by their keys
/// ("conversations" -> ShareGPT, "messages" -> OpenAI, "input_ids" -> Tokenized).
enum class InputFormat : uint8_t { Auto, ShareGPT, OpenAI, Tokenized, Text };
/// Parses "auto", "sharegpt", "openai", "tokenized", "text". Throws aerie::Error on anything else.
InputFormat input_format_from_name(const std::string& name);
const char* input_format_name(InputFormat f);

/// Why a record was not used (counted per reason, the first few reported with file:line).
enum class SkipReason : uint8_t {
  None = 0,
  Empty,          // blank JSONL line or an empty conversation/text
  BadJson,        // not a JSON object
  WrongTypes,     // missing keys, wrong types, unknown roles, mismatched array lengths, ids out of range
  NoAssistant,    // no assistant turn (nothing to train on)
  NoRest,         // text form: the story is a single sentence (no answer after the prompt)
  ZeroLoss,       // no loss-masked token after tokenization/truncation (e.g. empty assistant turns)
  Overlong,       // longer than max_length under --overlong drop
  Count_
};
const char* skip_name(SkipReason s);

/// One parsed record: a conversation, or (form Tokenized) tokens and loss mask, or a skip reason.
struct InputRecord {
  SkipReason skip = SkipReason::None;
  std::string detail;              // what was wrong, for the log
  bool tokenized = false;
  Conversation conversation;       // if !tokenized
  std::vector<int32_t> input_ids;  // if tokenized
  std::vector<uint8_t> loss_mask;  // if tokenized
};

/// Parses one JSONL line of `format` (Auto detects per line; Text is not a JSONL format).
/// ShareGPT: {"conversations": [{"from": "human"|"user"|"gpt"|"assistant"|"system"|"function_call"|
/// "observation"|"tool", "value": str}], optional top-level "system": str}. "function_call" is model output
/// (an assistant turn; a value that is a JSON {"name", "arguments"} object, or an array of them, also gives
/// its tool_calls, as LLaMA-Factory writes them)
/// (assistant); "observation"/"tool" are tool results (never trained on).
/// OpenAI: {"messages": [{"role": "system"|"developer"|"user"|"assistant"|"tool", "content": str or
/// [{"type": "text", "text": str}, ...] or null}], optional "tools": [...]}. Assistant messages may have
/// "tool_calls" ([{"id", "type", "function": {"name", "arguments": str or object}}]) and "reasoning_content"
/// (also read as "reasoning" or "thinking"); tool messages "tool_call_id" and "name". content may be null
/// or absent only in an assistant message with tool calls.
/// ShareGPT and OpenAI records may carry "tools" (an array, or a string holding one, as LLaMA-Factory writes).
/// Tokenized: {"input_ids": [int], "loss_mask": [0|1]} of equal length; ids must lie in [0, vocab_size).
/// A conversation without an assistant turn is NoAssistant.
InputRecord parse_json_record(const std::string& line, InputFormat format, int64_t vocab_size);

/// Whether `path` holds one JSON array of records (its first non-blank byte is '[', as in FastChat's and
/// LLaMA-Factory's .json files) rather than JSONL.
bool is_json_array_file(const std::string& path);

/// JSON array files: parses the whole file (every rank; use JSONL for large data) and calls
/// `fn(record, index)` for the elements [n*part/parts, n*(part+1)/parts) of the n elements, each parsed as
/// parse_json_record parses a line. Returns n. Throws aerie::Error naming the file if it is not one valid
/// JSON array.
int64_t for_each_array_record(const std::string& path, InputFormat format, int64_t vocab_size, int part, int parts,
                              const std::function<void(InputRecord&&, int64_t)>& fn);

/// Text form: splits one story (a block of non-blank lines, joined by '\n') into prompt and answer. The
/// prompt is the first sentence: up to and including the first '.', '!' or '?' that is followed by a space
/// or newline; the answer is the rest with leading whitespace removed. A story without a rest is NoRest.
InputRecord parse_story(const std::string& story);

/// A contiguous part of an input file read by one rank: records whose first byte lies in [begin, end).
/// Text files: the boundaries are moved to the start of a blank line so that no story is split; JSONL:
/// to the start of a line.
struct InputRange {
  int64_t begin = 0, end = 0;  // byte offsets, boundaries adjusted
  int64_t lines = 0;           // '\n'-terminated lines in [begin, end) (plus a last unterminated one)
};
/// Range of part `part` of `parts` equal byte ranges of `path`, boundaries adjusted. Throws aerie::Error if
/// the file cannot be read.
InputRange input_range(const std::string& path, bool text, int part, int parts);

/// Calls `fn(record_text, first_line, bytes_done)` for each record of `range` in file order: each line
/// for JSONL (blank ones included; without the '\n'), each story (its non-blank lines joined by '\n') for
/// text. first_line is 0-based within the range; bytes_done counts the bytes of the range read so far.
/// Throws aerie::Error naming the file on a read error.
void for_each_record(const std::string& path, const InputRange& range, bool text,
                     const std::function<void(const std::string&, int64_t, int64_t)>& fn);

}  // namespace aerie
