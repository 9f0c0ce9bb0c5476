// The work of `aerie generate --input`: regenerate the assistant turns of a conversation set with the target,
// so that the draft trains on the target's own responses (EAGLE-3 section 4; SpecForge's and Medusa's
// self-distillation data).
//
// The input is a prompt set as `aerie eval --prompts` reads it (data/prompt_input.h): conversations (ShareGPT
// or OpenAI messages, the prepare job's formats, data/prepare_input.h) or plain prompts, each read as a
// conversation (MT-Bench "turns": several user turns; "prompt" / "text" / "question" / "instruction": one; the
// first sentence of each story of a .txt file). Per conversation: every
// system, user and tool turn is kept verbatim; every assistant turn is replaced by the target's response to
// the conversation so far (already regenerated turns included), rendered by the chat template with its
// generation prompt (generation_prompt); when the conversation ends with a user or tool turn, a response is
// appended (prompt-only sets such as ShareGPT first turns). Assistant turns that carry tool calls (OpenAI
// "tool_calls", ShareGPT "function_call") are kept verbatim: their structure is not text the target writes.
// A turn whose prompt leaves no room under max_length ends the conversation after the previous answer; a
// conversation with no response at all is dropped (counted as overlong). The output record is the input
// record (same keys, same order, JSONL) with the assistant texts replaced; a plain prompt's is its other keys
// followed by "messages" (OpenAI form: the user turns and the target's answers), which prepare reads.
//
// Chunk c = input records [c*S, (c+1)*S) (JSONL lines, blank ones included, JSON array elements, or stories) ->
// "<output>.parts/chunk-%05d.jsonl", written as "*.tmp" and renamed when complete; when every chunk exists,
// world rank 0 concatenates them in order into <output> (tmp + rename). A rerun skips the chunks that exist
// (after checking "<output>.parts/run.json", which records the input, the chunking and the caller's run
// signature: model, template, sampling), so a killed run continues where it stopped and gives the same
// output as an uninterrupted one.
//
// Decoding: the responses of many conversations are decoded together by a ResponseEngine (the job's is
// model/sampling.h's BatchDecoder: continuous batching of up to --batch-size sequences). Each record is a
// small state machine (RecordRegeneration) that asks for one response at a time (turn k+1's prompt holds
// answer k); every record of every chunk the group holds asks in parallel, and a group takes its next chunk
// as soon as fewer responses are waiting than the engine decodes at once, so the batch stays full across
// chunk boundaries. A chunk is written when all of its records are done (in record order).
//
// Parallelism: the tp groups of `groups` take chunks from world rank 0 (which also works in group 0), with
// data/chunk_dispatcher.h (tags kRegenerateRequestTag / kRegenerateReplyTag; counters conversations,
// responses, new tokens: rank 0 logs their rates and the ETA): rank 0 answers pending requests between
// decoding steps. The response to conversation i, assistant turn k, depends only on (seed, i, k) and the
// prompt, so the output depends neither on the number of groups nor on the batch size.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "data/prepare_input.h"
#include "data/prepare_template.h"
#include "tokenizer/tokenizer.h"

namespace aerie {

inline constexpr int kRegenerateRequestTag = 7201;
inline constexpr int kRegenerateReplyTag = 7202;

/// Generates one response: prompt ids -> generated ids, at most max_new, the stop token (end of turn / EOS)
/// last when one ended it. conversation: the record index in the input, turn: the index of the response
/// within it (0, 1, ...), for the caller's RNG seed. Collective over the caller's tp group: every rank calls
/// it with the same arguments and must return the same ids.
using ResponseGenerator = std::function<std::vector<int32_t>(const std::vector<int32_t>& prompt, int64_t max_new,
                                                             int64_t conversation, int64_t turn)>;

/// One response to generate: the prompt ids, at most max_new (>= 1) new ids; conversation and turn as for
/// ResponseGenerator (the RNG seed of the response).
struct ResponseRequest {
  std::vector<int32_t> prompt;
  int64_t max_new = 0;
  int64_t conversation = 0, turn = 0;
};

/// A generated response: the key it was submitted under and its ids (as ResponseGenerator returns them).
struct ResponseResult {
  int64_t key = 0;
  std::vector<int32_t> ids;
};

/// The target as run_regenerate drives it: submit() queues requests, step() decodes (one batched forward,
/// typically) and returns the responses that finished. Collective over the caller's tp group: every rank
/// submits the same requests in the same order and calls step() together, and gets the same results.
/// jobs/generate.cc wraps model/sampling.h's BatchDecoder; serial_engine() wraps a ResponseGenerator.
struct ResponseEngine {
  int64_t batch_size = 1;  // responses decoded at once: run_regenerate keeps at least this many waiting
  std::function<void(int64_t key, const ResponseRequest& r)> submit;
  /// Called only while some submitted response has not been returned yet.
  std::function<std::vector<ResponseResult>()> step;
};

/// An engine that generates each submitted response alone with `generate` (step() returns the oldest
/// waiting one).
ResponseEngine serial_engine(ResponseGenerator generate);

/// The prompt of the next assistant turn of `so_far`: the tokens of ChatTemplate::render_prompt (the
/// conversation and the template's generation prompt, e.g. ChatML's "<|im_start|>assistant\n"; "plain": none),
/// each text segment tokenized by ChatTemplate::encode_text, as ChatTemplate::apply tokenizes for prepare.
std::vector<int32_t> generation_prompt(const ChatTemplate& tmpl, const Conversation& so_far, const Tokenizer& tok);

struct RegenerateParams {
  int64_t max_new_tokens = 512;  // per response
  int64_t max_length = 2048;     // prompt + response tokens of one turn (at most the model's positions)
  std::vector<int32_t> stop_ids;  // generated ids that end a response (dropped from the text)
};

/// One input record regenerated. ok = false: dropped (skip says why; detail for the log).
struct RegeneratedRecord {
  bool ok = false;
  SkipReason skip = SkipReason::None;
  std::string detail;
  std::string json;               // the output record, one line without '\n'
  int64_t responses = 0;          // assistant turns generated
  int64_t prompt_tokens = 0, new_tokens = 0;  // summed over the responses (new: stop tokens included)
  bool truncated = false;         // a turn did not fit under max_length: the rest of the record was dropped
  int64_t at_limit = 0;           // responses that reached their token limit without a stop token (written
                                  // with "aerie_finish_reason": "length"; prepare leaves their end of turn
                                  // untrained: the target never wrote it)
};

/// The regeneration of record `index` (one JSON object as text) as a state machine: pending() is the next
/// response it needs (the conversation so far with the template's generation prompt, the regenerated
/// answers included), answer() gives it, and when done() result() holds the record. format: as
/// parse_prompt_record takes it (Auto: a conversation or a plain prompt, by key; ShareGPT; OpenAI; Text: the
/// record is a story); Tokenized is an error (aerie::Error, from the constructor). Unusable records are
/// done at once with ok = false, as parse_prompt_record reports them (prompt-only conversations are fine).
class RecordRegeneration {
 public:
  RecordRegeneration(const std::string& record, InputFormat format, int64_t index, const ChatTemplate& tmpl,
                     const Tokenizer& tok, const RegenerateParams& params);
  ~RecordRegeneration();
  RecordRegeneration(RecordRegeneration&&) noexcept;
  bool done() const;
  /// The response needed next; null when done().
  const ResponseRequest* pending() const;
  /// The generated ids of pending() (the stop id last when one ended it). Throws aerie::Error when done().
  void answer(std::vector<int32_t> ids);
  /// The record (valid once done()).
  const RegeneratedRecord& result() const;

 private:
  struct State;
  std::unique_ptr<State> s_;
};

/// Regenerates record `index` with one call of `generate` per response (RecordRegeneration driven to the
/// end).
RegeneratedRecord regenerate_record(const std::string& record, InputFormat format, int64_t index,
                                    const ChatTemplate& tmpl, const Tokenizer& tok, const RegenerateParams& params,
                                    const ResponseGenerator& generate);

struct RegenerateOptions {
  std::string input;             // a prompt set (data/prompt_input.h): JSONL, a JSON array file, or .txt stories
  InputFormat format = InputFormat::Auto;  // Auto, ShareGPT, OpenAI or Text (PromptFile)
  std::string output;            // JSONL file; chunks under "<output>.parts/"
  RegenerateParams params;
  int64_t conversations_per_chunk = 16;
  int64_t max_conversations = -1;  // use only the first N records (< 0: all)
  /// Whatever else must match for a rerun to reuse existing chunks (model, template, sampling, seed; the
  /// job adds the target's fingerprint, the dtype and the input's sha256), as a JSON object; stored in
  /// run.json (read on world rank 0 only). Keys target_config_sha256, target_weights_sha256, dtype and
  /// input_sha256 missing from an earlier run.json (an earlier aerie's) are not a difference.
  std::string run_signature = "{}";
  /// Preemption, polled by every group leader before it takes a chunk (as ExtractOptions::stop_requested).
  std::function<bool()> stop_requested;
};

/// World totals, the same on every rank.
struct RegenerateStats {
  int64_t records = 0;           // input records considered (after max_conversations)
  int64_t chunks = 0, chunks_skipped = 0, chunks_done = 0;
  int64_t conversations = 0, dropped = 0, truncated = 0;  // by this run: written, dropped, cut short
  int64_t at_limit = 0;          // responses that ended at --max-new-tokens (or max_length), not at a stop token
  int64_t responses = 0, prompt_tokens = 0, new_tokens = 0;
  double seconds = 0;
  bool stopped = false;          // a stop was requested: some chunks may be missing, <output> not written
  bool complete = false;         // every chunk exists and <output> was written
};

/// Regenerates every missing chunk and, when all exist, writes <output>. Collective over groups.world;
/// `engine` is collective over groups.tp. World rank 0 holds <output>'s lock (<output>.lock,
/// io/output_lock.h) unless this process holds it already (the job), and removes stale .tmp files of the
/// parts folder only under it. Throws aerie::CollectiveError (every rank, before anything is written) when the
/// input holds no record (an empty JSON array; max_conversations 0), aerie::Error on an unreadable input, a non-conversation format, a
/// parts folder of another run, or I/O failure (the caller aborts: peers may be waiting), and
/// aerie::CollectiveError (every rank) when another job holds the lock.
RegenerateStats run_regenerate(const RegenerateOptions& options, ParallelGroups& groups, const ChatTemplate& tmpl,
                               const Tokenizer& tok, const ResponseEngine& engine);
/// The same with serial_engine(generate).
RegenerateStats run_regenerate(const RegenerateOptions& options, ParallelGroups& groups, const ChatTemplate& tmpl,
                               const Tokenizer& tok, const ResponseGenerator& generate);

}  // namespace aerie
