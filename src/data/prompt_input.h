// Prompt sets: the records `aerie generate --input` and `aerie eval --prompts` read, with one reader for
// both jobs. A record is a conversation or a plain prompt, and every record is read as
// a conversation:
//   - a conversation: ShareGPT ("conversations") or OpenAI ("messages"), prepare's formats
//     (data/prepare_input.h); it may end with a user turn (prompt-only sets such as ShareGPT first turns);
//   - a JSON object with "turns": [str, ...] (MT-Bench, Spec-Bench, EAGLE's question sets): one user turn per
//     string, an empty assistant turn between two of them (generate answers each in turn);
//   - a JSON object with a string "prompt", "text", "question" or "instruction" (the first of these keys
//     present): one user turn; a non-empty string "input" beside "instruction" (Alpaca) follows it after a
//     blank line;
//   - a story of a text file (format Text, or Auto and a ".txt" name; stories are separated by blank lines):
//     its first sentence (parse_story's user turn; a single-sentence story is skipped, NoRest).
// A plain JSON prompt may carry a string "system" (a system turn first). Files: JSONL (one record per line),
// a JSON array of records (first non-blank byte '['), or a text file of stories.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "data/prepare_input.h"

namespace aerie {

/// One record of a prompt set as a conversation. skip != None: not usable (detail says why).
struct PromptRecord {
  SkipReason skip = SkipReason::None;
  std::string detail;
  /// ShareGPT or OpenAI: the form of `json`.
  InputFormat format = InputFormat::Auto;
  /// The record as one JSON object (one line): a conversation record as it was given; a plain prompt as its
  /// other keys in order followed by "messages" (OpenAI form, an empty assistant message between two user
  /// turns), the prompt keys (turns, prompt, text, question, instruction, input, system) left out.
  std::string json;
  /// Its turns in order, as parse_json_record reads them (a ShareGPT top-level "system" is turn 0), without
  /// the requirement of an assistant turn.
  Conversation conversation;
};

/// Reads one record of a prompt set: a JSONL line or JSON array element, or (format Text) one story of a
/// text file. format: Auto (any form above), ShareGPT or OpenAI (conversations of that form only), Text.
/// Never throws on bad input: Empty (blank), BadJson (not a JSON object), WrongTypes (none of the keys
/// above, or values of the wrong type), NoRest (a single-sentence story). Throws aerie::Error for the
/// Tokenized format (a prompt set has no token ids).
PromptRecord parse_prompt_record(const std::string& record, InputFormat format);

/// The JSON keys that make a plain prompt, in the order they are looked for ("turns" first).
const std::vector<std::string>& prompt_keys();

/// The records of a prompt set by index: the lines of a JSONL file (blank ones included, so that record i
/// is line i + 1), the elements of a JSON array file, or the stories of a text file (format Text, or Auto
/// and a name ending in ".txt"). The JSONL and text records are found by byte offset and read on demand;
/// a JSON array is parsed whole at opening.
class PromptFile {
 public:
  /// Indexes `path`. Throws aerie::Error naming the file when it is missing, unreadable, or starts with
  /// '[' but is not one valid JSON array.
  PromptFile(const std::string& path, InputFormat format);
  ~PromptFile();
  PromptFile(PromptFile&&) noexcept;
  int64_t size() const { return size_; }
  /// The format to give parse_prompt_record for its records: Text for a story file, else the one given.
  InputFormat record_format() const { return record_format_; }
  /// Records [b, e) as text (0 <= b <= e <= size()): JSONL lines without their '\n' (and '\r'), array
  /// elements written as one-line JSON, stories with their lines joined by '\n'. Throws aerie::Error naming
  /// the file on a read error or a bad range.
  std::vector<std::string> read(int64_t b, int64_t e) const;
  /// Where record i is, for messages: "PATH:LINE" (JSONL, text: the record's first line, 1-based) or
  /// "PATH element I" (JSON array).
  std::string where(int64_t i) const;
  const std::string& path() const { return path_; }

 private:
  struct Array;  // the parsed elements of a JSON array file
  std::string path_;
  InputFormat record_format_ = InputFormat::Auto;
  std::unique_ptr<Array> array_;   // null unless a JSON array file
  std::vector<int64_t> offsets_;   // JSONL / text: byte offset of record i's first line
  std::vector<int64_t> lines_;     // JSONL / text: its 0-based line
  int64_t file_size_ = 0, size_ = 0;
};

}  // namespace aerie
