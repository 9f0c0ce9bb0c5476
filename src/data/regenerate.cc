// Regeneration of assistant turns (see regenerate.h): one record, the input index, chunk dispatch and output.
#include "data/regenerate.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <sstream>

#include "core/error.h"
#include "core/log.h"
#include "data/chat_templates_json.h"
#include "data/chunk_dispatcher.h"
#include "data/prompt_input.h"
#include "io/output_lock.h"

namespace aerie {

namespace fs = std::filesystem;
using ojson = nlohmann::ordered_json;

// --------------------------------------------------------------------------------------------- one record

std::vector<int32_t> generation_prompt(const ChatTemplate& tmpl, const Conversation& so_far, const Tokenizer& tok) {
  std::vector<int32_t> ids;
  for (const TemplateSegment& seg : tmpl.render_prompt(so_far)) {
    std::vector<int32_t> part = seg.ids.empty() ? tmpl.encode_text(seg.text, tok) : seg.ids;
    ids.insert(ids.end(), part.begin(), part.end());
  }
  return ids;
}

namespace {

RegeneratedRecord dropped(SkipReason why, std::string detail) {
  RegeneratedRecord r;
  r.skip = why;
  r.detail = std::move(detail);
  return r;
}

// An assistant message whose content is a tool call (kept verbatim).
bool has_tool_call(const ojson& m, InputFormat f) {
  if (f == InputFormat::ShareGPT) return m.value("from", "") == "function_call";
  return m.contains("tool_calls") && !m["tool_calls"].is_null() && !(m["tool_calls"].is_array() && m["tool_calls"].empty());
}

}  // namespace

struct RecordRegeneration::State {
  const ChatTemplate& tmpl;
  const Tokenizer& tok;
  const RegenerateParams& params;
  int64_t index = 0;
  ojson j;                        // the input record
  std::string key;                // "conversations" or "messages"
  InputFormat format = InputFormat::Auto;
  std::vector<ChatTurn> turns;    // parsed (a ShareGPT top-level "system" is turn 0)
  size_t offset = 0;              // turns.size() - messages
  Conversation so_far;            // the conversation up to the next response (regenerated answers included)
  ojson new_msgs = ojson::array();
  size_t answered = 0;            // new_msgs up to and including the last assistant message
  size_t i = 0;                   // the next turn to look at
  bool open_end = false;          // the response asked for is appended (the record ends with a user/tool turn)
  bool finished = false;
  ResponseRequest request;        // valid while !finished
  RegeneratedRecord out;

  State(const ChatTemplate& t, const Tokenizer& k, const RegenerateParams& p) : tmpl(t), tok(k), params(p) {}
  void start(const std::string& record, InputFormat f);

  void drop(SkipReason why, std::string detail) {
    out = dropped(why, std::move(detail));
    finished = true;
  }
  // Sets `request` to the response to so_far; false when the prompt leaves no room under max_length.
  bool ask() {
    std::vector<int32_t> prompt = generation_prompt(tmpl, so_far, tok);
    const int64_t room = std::min(params.max_new_tokens, params.max_length - static_cast<int64_t>(prompt.size()));
    if (room < 1 || prompt.empty()) return false;
    request.prompt = std::move(prompt);
    request.max_new = room;
    request.conversation = index;
    request.turn = out.responses;
    return true;
  }
  // Walks the turns up to the next response to ask for, or to the end (then the record is finished).
  void advance() {
    const ojson& msgs = j[key];
    for (; i < turns.size(); ++i) {
      const ojson* src = i >= offset ? &msgs[i - offset] : nullptr;
      if (turns[i].role == ChatRole::Assistant && src && !has_tool_call(*src, format)) {
        if (ask()) return;
        out.truncated = true;
        // Cut short: the record ends with its last answer (no unanswered user turn left at the end).
        new_msgs.erase(new_msgs.begin() + static_cast<std::ptrdiff_t>(answered), new_msgs.end());
        return finish();
      }
      so_far.turns.push_back(turns[i]);
      if (src) new_msgs.push_back(*src);
      if (turns[i].role == ChatRole::Assistant) answered = new_msgs.size();
    }
    if (!open_end && !turns.empty() &&
        (turns.back().role == ChatRole::User || turns.back().role == ChatRole::Tool)) {
      open_end = true;
      if (ask()) return;
      out.truncated = true;
      new_msgs.erase(new_msgs.begin() + static_cast<std::ptrdiff_t>(answered), new_msgs.end());
    }
    finish();
  }
  void answer(std::vector<int32_t> ids) {
    out.responses += 1;
    out.prompt_tokens += static_cast<int64_t>(request.prompt.size());
    out.new_tokens += static_cast<int64_t>(ids.size());
    const bool stopped =
        !ids.empty() && std::find(params.stop_ids.begin(), params.stop_ids.end(), ids.back()) != params.stop_ids.end();
    if (stopped) ids.pop_back();
    // No stop token: the answer ends at the token limit, as OpenAI's finish_reason "length".
    const bool at_limit = !stopped && static_cast<int64_t>(ids.size()) >= request.max_new;
    out.at_limit += at_limit ? 1 : 0;
    const std::string text = tok.decode(ids);
    ChatTurn turn{};
    turn.role = ChatRole::Assistant;
    turn.text = text;
    so_far.turns.push_back(std::move(turn));
    const bool sharegpt = format == InputFormat::ShareGPT;
    // The target's own ids beside the text: prepare trains on them instead of
    // encoding the decoded text alone again, which would not give them back.
    if (open_end) {
      ojson m = sharegpt ? ojson{{"from", "gpt"}, {"value", text}} : ojson{{"role", "assistant"}, {"content", text}};
      m["aerie_response_ids"] = ids;
      if (at_limit) m["aerie_finish_reason"] = "length";
      new_msgs.push_back(std::move(m));
      return finish();
    }
    ojson m = j[key][i - offset];
    if (sharegpt) {
      m["value"] = text;
    } else {
      m["content"] = text;
      for (const char* k : {"reasoning_content", "reasoning", "thinking"}) m.erase(k);  // not the target's
    }
    m["aerie_response_ids"] = ids;
    m.erase("aerie_finish_reason");  // an earlier regeneration's, of another answer
    if (at_limit) m["aerie_finish_reason"] = "length";
    new_msgs.push_back(std::move(m));
    answered = new_msgs.size();
    ++i;
    advance();
  }
  void finish() {
    finished = true;
    request = ResponseRequest{};
    if (out.responses == 0) {
      const bool truncated = out.truncated;
      out = truncated ? dropped(SkipReason::Overlong, "the first prompt leaves no room under max_length")
                      : dropped(SkipReason::NoAssistant, "no turn to answer");
      out.truncated = truncated;
      return;
    }
    j[key] = std::move(new_msgs);
    out.json = chat::dump_exact(j);  // a response cut mid-character: U+FFFD; integers beyond 64 bits kept
    out.ok = true;
  }
};

// Parses the record (data/prompt_input.h: a conversation, or a plain prompt read as one) and walks to its
// first response (or drops it).
void RecordRegeneration::State::start(const std::string& record, InputFormat f) {
  AERIE_CHECK(f == InputFormat::Auto || f == InputFormat::ShareGPT || f == InputFormat::OpenAI ||
                  f == InputFormat::Text,
              "generate: input format " << input_format_name(f) << " has no conversations to regenerate "
                                        << "(use auto, sharegpt, openai or text)");
  PromptRecord rec = parse_prompt_record(record, f);
  if (rec.skip != SkipReason::None) return drop(rec.skip, rec.detail);
  j = chat::parse_json_exact(rec.json);
  format = rec.format;
  key = format == InputFormat::ShareGPT ? "conversations" : "messages";
  turns = std::move(rec.conversation.turns);
  const size_t n_msgs = j[key].size();
  AERIE_CHECK(turns.size() >= n_msgs && turns.size() - n_msgs <= 1,
              "generate: record " << index << ": " << turns.size() << " parsed turns for " << n_msgs << " messages");
  offset = turns.size() - n_msgs;
  so_far = rec.conversation;  // keeps whatever else the reader stores (tools)
  so_far.turns.clear();
  advance();
}

RecordRegeneration::RecordRegeneration(const std::string& record, InputFormat format, int64_t index,
                                       const ChatTemplate& tmpl, const Tokenizer& tok, const RegenerateParams& params)
    : s_(std::make_unique<State>(tmpl, tok, params)) {
  s_->index = index;
  s_->start(record, format);
}

RecordRegeneration::~RecordRegeneration() = default;
RecordRegeneration::RecordRegeneration(RecordRegeneration&&) noexcept = default;

bool RecordRegeneration::done() const { return s_->finished; }
const ResponseRequest* RecordRegeneration::pending() const { return s_->finished ? nullptr : &s_->request; }
const RegeneratedRecord& RecordRegeneration::result() const { return s_->out; }

void RecordRegeneration::answer(std::vector<int32_t> ids) {
  AERIE_CHECK(!s_->finished, "generate: record " << s_->index << " got an answer after it was done");
  s_->answer(std::move(ids));
}

RegeneratedRecord regenerate_record(const std::string& record, InputFormat format, int64_t index,
                                    const ChatTemplate& tmpl, const Tokenizer& tok, const RegenerateParams& params,
                                    const ResponseGenerator& generate) {
  RecordRegeneration r(record, format, index, tmpl, tok, params);
  while (const ResponseRequest* q = r.pending()) r.answer(generate(q->prompt, q->max_new, q->conversation, q->turn));
  return r.result();
}

ResponseEngine serial_engine(ResponseGenerator generate) {
  struct Queue {
    std::deque<std::pair<int64_t, ResponseRequest>> q;
  };
  auto queue = std::make_shared<Queue>();
  ResponseEngine e;
  e.batch_size = 1;
  e.submit = [queue](int64_t key, const ResponseRequest& r) { queue->q.emplace_back(key, r); };
  e.step = [queue, generate = std::move(generate)]() {
    std::vector<ResponseResult> out;
    if (queue->q.empty()) return out;
    auto [key, r] = std::move(queue->q.front());
    queue->q.pop_front();
    out.push_back({key, generate(r.prompt, r.max_new, r.conversation, r.turn)});
    return out;
  };
  return e;
}

// ------------------------------------------------------------------------------------------------ the run

namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::string chunk_name(int64_t c) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "chunk-%05lld.jsonl", static_cast<long long>(c));
  return buf;
}

// `text` into `path` through `tmp` ("<path>.tmp" when empty), renamed when complete.
void write_file(const std::string& path, const std::string& text, const std::string& tmp_path = "") {
  const std::string tmp = tmp_path.empty() ? path + ".tmp" : tmp_path;
  errno = 0;
  std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
  if (out) {
    out << text;
    out.flush();
  }
  if (!out) {  // a full disk: the partial file is removed (its space back), the chunks already written stay
    const int err = errno;
    out.close();
    std::error_code ec;
    fs::remove(tmp, ec);
    AERIE_THROW("generate: cannot write " << tmp << (err ? std::string(": ") + std::strerror(err) : std::string())
                                          << "; the partial file is removed, the chunks written before are kept: "
                                          << "make room and rerun the same command to finish");
  }
  out.close();
  std::error_code ec;
  fs::rename(tmp, path, ec);
  AERIE_CHECK(!ec, "generate: cannot rename " << tmp << " to " << path << ": " << ec.message());
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  AERIE_CHECK(in, "generate: cannot read " << path);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// Rank 0: creates the parts folder with run.json, or checks that an existing one is this run's.
void open_parts(const std::string& parts, const ojson& run) {
  fs::create_directories(parts);
  const std::string meta = (fs::path(parts) / "run.json").string();
  if (fs::exists(meta)) {
    ojson old = ojson::parse(read_file(meta), nullptr, false);
    AERIE_CHECK(!old.is_discarded() && old.is_object(),
                "generate: " << meta << " is not a JSON object (damaged?). Remove " << parts
                             << " or choose another --output.");
    if (old != run) {  // name the settings that differ (a changed option, usually), not two whole records
      std::ostringstream diff;
      int n = 0;
      // Objects are compared key by key; the job's own settings ("run": generate's options) by their names.
      std::function<void(const ojson&, const ojson&, const std::string&)> compare = [&](const ojson& mine,
                                                                                         const ojson& theirs,
                                                                                         const std::string& path) {
        if (mine.is_object() && theirs.is_object()) {
          for (const auto& [key, value] : mine.items())
            compare(value, theirs.contains(key) ? theirs[key] : ojson(), path == "run" || path.empty() ? key : path + "." + key);
          for (const auto& [key, value] : theirs.items())
            if (!mine.contains(key)) compare(ojson(), value, path == "run" || path.empty() ? key : path + "." + key);
        } else if (theirs.is_null() && (path == "target_config_sha256" || path == "target_weights_sha256" ||
                                        path == "dtype" || path == "input_sha256")) {
          // A run.json of an earlier aerie lacks them: not a difference.
        } else if (mine != theirs) {
          // The settings named as the options that set them (run.json's keys otherwise).
          static const std::map<std::string, std::string> option = {
              {"model", "--model"},           {"template", "--template"},
              {"temperature", "--temperature"}, {"top_p", "--top-p"},
              {"seed", "--seed"},             {"fp8_gemm", "--fp8-gemm (with --tp)"},
              {"input", "--input"},           {"input_format", "--format"},
              {"max_new_tokens", "--max-new-tokens"}, {"max_length", "--max-length"},
              {"stop_ids", "--stop-id"},      {"conversations_per_chunk", "--conversations-per-chunk"},
              {"dtype", "--dtype"},
              {"records", "the records used (--max-conversations, or the input's count)"},
              {"target_config_sha256", "--model's config.json (sha256)"},
              {"target_weights_sha256", "--model's weights (sampled sha256: another checkpoint at that path?)"},
              {"input_sha256", "--input's contents (sha256: the file was edited)"}};
          const auto o = option.find(path);
          diff << (n++ ? "; " : "") << (o == option.end() ? path : o->second) << " "
               << (mine.is_null() ? std::string("not set") : mine.dump()) << " (the earlier run: "
               << (theirs.is_null() ? std::string("not set") : theirs.dump()) << ")";
        }
      };
      compare(run, old, "");
      if (n > 0)
        AERIE_THROW("generate: " << meta << " records another run: " << diff.str()
                                 << ". Rerun with the earlier run's settings to continue it, or remove " << parts
                                 << " (or choose another --output) to start again.");
      // Only settings an earlier aerie did not record: the same run; run.json gains them for the next resume.
      AERIE_LOG(info) << "generate: " << meta << " of an earlier aerie lacks the target's fingerprint, the dtype or "
                      << "the input's sha256: resuming, recording them now";
      write_file(meta, run.dump(2) + "\n");
    }
  } else {
    write_file(meta, run.dump(2) + "\n");
  }
  for (const auto& e : fs::directory_iterator(parts)) {
    const std::string name = e.path().filename().string();
    if (name.size() > 4 && name.substr(name.size() - 4) == ".tmp") {
      AERIE_LOG(info) << "generate: removing stale " << e.path().string();
      fs::remove(e.path());
    }
  }
}

// The chunks a group holds: their records' state machines, until every record is done.
struct OpenChunk {
  int64_t chunk = 0, first = 0;  // records [first, first + records.size())
  std::vector<RecordRegeneration> records;
  int64_t waiting = 0;           // records not done
};

// World rank 0: the parts folder opened for this run (its run record checked or written), the chunks still to
// do (the complete ones counted in stats) and the dispatcher that hands them to the tp groups.
std::unique_ptr<ChunkDispatcher> dispatch_regenerate_chunks(const RegenerateOptions& opt, ParallelGroups& groups,
                                                            RegenerateStats& stats, int64_t batch_size,
                                                            const std::string& parts) {
  MpiCommunicator& world = *groups.world;
  const int64_t S = opt.conversations_per_chunk;
  auto chunk_path = [&](int64_t c) { return (fs::path(parts) / chunk_name(c)).string(); };
  std::unique_ptr<ChunkDispatcher> dispatcher;
  ojson sig = ojson::parse(opt.run_signature, nullptr, false);
  AERIE_CHECK(!sig.is_discarded(), "generate: run signature is not JSON: " << opt.run_signature);
  ojson run = {{"format", "aerie.regenerate"},
               {"format_version", 1},
               {"input", fs::weakly_canonical(opt.input).string()},
               {"input_format", input_format_name(opt.format)},
               {"records", stats.records},
               {"conversations_per_chunk", S},
               {"max_new_tokens", opt.params.max_new_tokens},
               {"max_length", opt.params.max_length},
               {"stop_ids", opt.params.stop_ids},
               {"run", sig}};
  open_parts(parts, run);
  std::deque<int64_t> todo;
  double todo_records = 0;
  for (int64_t c = 0; c < stats.chunks; ++c) {
    if (fs::exists(chunk_path(c))) {
      ++stats.chunks_skipped;
    } else {
      todo.push_back(c);
      todo_records += static_cast<double>(std::min(stats.records, (c + 1) * S) - c * S);
    }
  }
  AERIE_LOG(info) << "generate: " << stats.records << " records in " << stats.chunks << " chunks of " << S << "; "
                  << stats.chunks_skipped << " already done, " << todo.size() << " to do by " << groups.map.dp
                  << " group(s) of " << groups.map.tp << " rank(s), " << batch_size
                  << " sequence(s) decoded at once per group";
  dispatcher = std::make_unique<ChunkDispatcher>(
      world, groups.map.dp, std::move(todo), "generate",
      std::vector<ChunkDispatcher::Counter>{{"conversations", todo_records}, {"responses", 0}, {"new tokens", 0}},
      kRegenerateRequestTag, kRegenerateReplyTag);
  return dispatcher;
}

// World totals of `stats` (leaders count their group's work; `stopped_here`: this rank saw a stop) written
// back into it; the all-reduce also waits for every group's files. Returns the totals: stats' counters,
// stopped, then the drops per SkipReason (index 8 + reason), then at_limit.
std::vector<int64_t> sum_regenerate_stats(RegenerateStats& stats, const int64_t* skip_counts, bool leader,
                                          bool stopped_here, MpiCommunicator& world) {
  auto own = [&](int64_t v) { return leader ? v : 0; };
  std::vector<int64_t> local = {own(stats.chunks_done), own(stats.conversations), own(stats.dropped),
                                own(stats.truncated), own(stats.responses),     own(stats.prompt_tokens),
                                own(stats.new_tokens), stopped_here ? 1 : 0};
  for (int i = 0; i < static_cast<int>(SkipReason::Count_); ++i) local.push_back(own(skip_counts[i]));
  local.push_back(own(stats.at_limit));  // last
  Tensor totals = Tensor::from_vector<int64_t>(local, {static_cast<int64_t>(local.size())});
  world.all_reduce_sum(totals);
  const int64_t* t = totals.data<int64_t>();
  stats.chunks_done = t[0];
  stats.conversations = t[1];
  stats.dropped = t[2];
  stats.truncated = t[3];
  stats.responses = t[4];
  stats.prompt_tokens = t[5];
  stats.new_tokens = t[6];
  stats.stopped = t[7] != 0;
  stats.at_limit = t[local.size() - 1];
  return std::vector<int64_t>(t, t + local.size());
}

// World rank 0: the run's totals (`t`: sum_regenerate_stats's, for the drops per reason), a warning for the
// responses cut at --max-new-tokens, and the output written.
void log_regenerate_totals(const RegenerateStats& stats, const int64_t* t, const RegenerateOptions& opt) {
  std::string why;
  for (int s = 1; s < static_cast<int>(SkipReason::Count_); ++s)
    if (t[8 + s] > 0) why += std::string(why.empty() ? "" : ", ") + skip_name(static_cast<SkipReason>(s)) + " " +
                             std::to_string(t[8 + s]);
  AERIE_LOG(info) << "generate: " << stats.chunks_done << " chunk(s), " << stats.conversations << " conversations, "
                  << stats.responses << " responses, " << stats.new_tokens << " new tokens (" << stats.prompt_tokens
                  << " prompt tokens) in " << stats.seconds << " s ("
                  << (stats.seconds > 0 ? stats.new_tokens / stats.seconds : 0) << " new tokens/s); dropped "
                  << stats.dropped << (why.empty() ? "" : " (" + why + "; the first of each group named above)")
                  << ", cut short " << stats.truncated
                  << " (a turn past --max-length)";
  if (stats.at_limit > 0)
    AERIE_LOG(warning) << "generate: " << stats.at_limit << " of " << stats.responses << " responses ended at "
                       << "--max-new-tokens " << opt.params.max_new_tokens << " (or --max-length) without a stop "
                       << "token; they carry \"aerie_finish_reason\": \"length\", and prepare leaves their end of "
                       << "turn untrained (the target never wrote it). Raise --max-new-tokens (or --max-length) for "
                       << "whole answers";
  if (stats.complete) AERIE_LOG(info) << "generate: wrote " << opt.output;
}

// A complete chunk's file: the JSON line of each of its records that was not dropped, in input order.
void write_chunk(const OpenChunk& oc, const std::string& path) {
  std::string text;
  for (const RecordRegeneration& rec : oc.records) {
    if (!rec.result().ok) continue;
    text += rec.result().json;
    text += '\n';
  }
  write_file(path, text);
}

// A finished record `r` (input record `index` of `input`) counted in `stats`, in `unreported` (records,
// responses, new tokens) and, when dropped, in `skip_counts` by reason; the group leader names the first
// kDropsNamed drops of its group (`named_drops` so far) as warnings, the others at debug level.
void count_record(const RegeneratedRecord& r, int64_t index, const PromptFile& input, bool leader,
                  RegenerateStats& stats, std::vector<int64_t>& unreported, int64_t* skip_counts,
                  int64_t& named_drops) {
  constexpr int64_t kDropsNamed = 5;  // dropped records named in a warning, per group
  stats.responses += r.responses;
  stats.prompt_tokens += r.prompt_tokens;
  stats.new_tokens += r.new_tokens;
  stats.truncated += r.truncated ? 1 : 0;
  stats.at_limit += r.at_limit;
  unreported[0] += 1;
  unreported[1] += r.responses;
  unreported[2] += r.new_tokens;
  if (r.ok) {
    ++stats.conversations;
  } else {
    ++stats.dropped;
    ++skip_counts[static_cast<int>(r.skip)];
    // The first few of each group named as a warning (file:line and why), the others at debug level;
    // blank lines are not worth a line.
    if (leader && r.skip != SkipReason::Empty)
      BOOST_LOG_SEV(boost::log::trivial::logger::get(),
                    ++named_drops <= kDropsNamed ? boost::log::trivial::warning : boost::log::trivial::debug)
          << "generate: dropped " << input.where(index) << ": " << skip_name(r.skip)
          << (r.detail.empty() ? "" : " (" + r.detail + ")");
  }
}

// Rank 0: every chunk of the parts folder present -> the output file (written through a temporary file of
// this job's own). Collective over `world`: returns whether the output was written.
bool write_output_if_complete(const RegenerateOptions& opt, int64_t chunks, const std::string& parts,
                              MpiCommunicator& world) {
  auto chunk_path = [&](int64_t c) { return (fs::path(parts) / chunk_name(c)).string(); };
  Tensor complete = Tensor::zeros({1}, DType::I64);
  if (world.rank() == 0) {
    bool all = true;
    for (int64_t c = 0; c < chunks && all; ++c) all = fs::exists(chunk_path(c));
    if (all) {
      std::string text;
      for (int64_t c = 0; c < chunks; ++c) text += read_file(chunk_path(c));
      write_file(opt.output, text, unique_tmp_path(opt.output));  // a temporary file of this job's own
      complete.data<int64_t>()[0] = 1;
    }
  }
  world.all_reduce_sum(complete);
  return complete.data<int64_t>()[0] != 0;
}

}  // namespace

RegenerateStats run_regenerate(const RegenerateOptions& opt, ParallelGroups& groups, const ChatTemplate& tmpl,
                               const Tokenizer& tok, const ResponseEngine& engine) {
  const double t0 = now_s();
  const int64_t S = opt.conversations_per_chunk;
  AERIE_CHECK(S > 0, "generate: --conversations-per-chunk must be > 0, got " << S);
  AERIE_CHECK(opt.params.max_new_tokens > 0, "generate: --max-new-tokens must be > 0");
  AERIE_CHECK(engine.batch_size >= 1 && engine.submit && engine.step, "generate: invalid response engine");
  MpiCommunicator& world = *groups.world;
  MpiCommunicator& tp = *groups.tp;
  const bool leader = tp.rank() == 0;

  AERIE_CHECK(fs::is_regular_file(opt.input), "generate: input " << opt.input << ": no such file");
  const PromptFile input(opt.input, opt.format);
  RegenerateStats stats;
  stats.records = opt.max_conversations >= 0 ? std::min(opt.max_conversations, input.size()) : input.size();
  stats.chunks = (stats.records + S - 1) / S;
  // Every rank indexed the same file: all refuse together, before an empty output is written.
  if (stats.records == 0)
    throw CollectiveError("generate: --input " + opt.input + " holds no record" +
                          (opt.max_conversations == 0 ? " (--max-conversations 0)" : " (an empty JSON array?)"));
  const std::string parts = opt.output + ".parts";
  // OUTPUT.lock on rank 0, unless the job holds it already: open_parts removes stale .tmp files only under it.
  const OutputLock lock = acquire_output_lock(world.handle(), opt.output, LockTarget::File, "generate");
  auto chunk_path = [&](int64_t c) { return (fs::path(parts) / chunk_name(c)).string(); };

  std::unique_ptr<ChunkDispatcher> dispatcher;
  if (world.rank() == 0) dispatcher = dispatch_regenerate_chunks(opt, groups, stats, engine.batch_size, parts);

  // This group's work: the chunks it holds (by chunk index) and the record of each submitted response (its
  // key is the record's input index: a record waits for one response at a time).
  std::map<int64_t, OpenChunk> open;
  std::map<int64_t, int64_t> chunk_of;  // record index -> chunk
  int64_t in_flight = 0;                // responses submitted, not returned
  int64_t skip_counts[static_cast<int>(SkipReason::Count_)] = {};
  int64_t named_drops = 0;  // dropped records named so far (count_record)
  // Work finished since the last report to rank 0 (records, responses, new tokens), the last chunk written.
  std::vector<int64_t> unreported(3, 0);
  int64_t last_written = -1;

  auto submit = [&](int64_t index, const RecordRegeneration& r) {
    engine.submit(index, *r.pending());
    ++in_flight;
  };
  // A record is done: count it; its chunk complete -> the leader writes it.
  auto record_done = [&](OpenChunk& oc, int64_t index) {
    count_record(oc.records[index - oc.first].result(), index, input, leader, stats, unreported, skip_counts,
                 named_drops);
    if (--oc.waiting > 0) return;
    if (leader) write_chunk(oc, chunk_path(oc.chunk));
    ++stats.chunks_done;
    last_written = oc.chunk;
    open.erase(oc.chunk);
  };
  auto start_chunk = [&](int64_t c) {
    const int64_t b = c * S, e = std::min(stats.records, (c + 1) * S);
    OpenChunk& oc = open[c];
    oc.chunk = c;
    oc.first = b;
    std::vector<std::string> records = input.read(b, e);
    for (int64_t i = b; i < e; ++i)
      oc.records.emplace_back(records[i - b], input.record_format(), i, tmpl, tok, opt.params);
    oc.waiting = e - b;  // > 0: chunks are non-empty ranges
    for (int64_t i = b; i < e; ++i) {
      if (oc.records[i - b].done()) {
        record_done(oc, i);  // may erase the chunk: the last record
        if (!open.count(c)) return;
      } else {
        chunk_of[i] = c;
        submit(i, oc.records[i - b]);
      }
    }
  };

  Tensor cmd = Tensor::zeros({1}, DType::I64);
  bool stop_seen = false, exhausted = false;
  for (;;) {
    // Take chunks while fewer responses wait than the engine decodes at once (the same decision on every
    // rank of the group: the state is the same).
    while (!exhausted && in_flight < engine.batch_size) {
      int64_t c = -1;
      if (opt.stop_requested && opt.stop_requested()) stop_seen = true;
      if (leader) {
        if (dispatcher) {
          if (stop_seen) dispatcher->stop();
          dispatcher->completed(unreported);
          dispatcher->serve_pending();
          c = dispatcher->next();
        } else {
          c = ChunkDispatcher::request(world, groups.map.dp_rank, last_written, unreported, stop_seen,
                                       kRegenerateRequestTag, kRegenerateReplyTag);
        }
        std::fill(unreported.begin(), unreported.end(), 0);
        last_written = -1;
        cmd.data<int64_t>()[0] = c;
      }
      tp.broadcast(cmd, 0);
      c = cmd.data<int64_t>()[0];
      if (c < 0) {
        exhausted = true;
        break;
      }
      start_chunk(c);
    }
    if (in_flight == 0) {
      if (exhausted) break;
      continue;
    }
    for (ResponseResult& res : engine.step()) {
      --in_flight;
      auto it = chunk_of.find(res.key);
      AERIE_CHECK(it != chunk_of.end(), "generate: the engine returned a response for record " << res.key
                                                                                              << ", which waits for none");
      OpenChunk& oc = open.at(it->second);
      RecordRegeneration& rec = oc.records[res.key - oc.first];
      rec.answer(std::move(res.ids));
      if (rec.done()) {
        chunk_of.erase(it);
        record_done(oc, res.key);
      } else {
        submit(res.key, rec);
      }
    }
    if (dispatcher) {
      dispatcher->completed(unreported);
      std::fill(unreported.begin(), unreported.end(), 0);
      dispatcher->serve_pending();
    }
  }
  AERIE_CHECK(open.empty(), "generate: " << open.size() << " chunk(s) left open at the end");
  if (dispatcher) dispatcher->drain();

  // World totals (leaders count their group's work); the all-reduce also waits for every group's files.
  const bool stopped_here = stop_seen || (dispatcher && dispatcher->stopped_any());
  const std::vector<int64_t> totals = sum_regenerate_stats(stats, skip_counts, leader, stopped_here, world);
  const int64_t* t = totals.data();

  // Rank 0: every chunk present -> the output file.
  stats.complete = write_output_if_complete(opt, stats.chunks, parts, world);
  stats.seconds = now_s() - t0;
  // (no Progress::finish: other groups' last work is not reported to rank 0)
  if (dispatcher) log_regenerate_totals(stats, t, opt);
  return stats;
}

RegenerateStats run_regenerate(const RegenerateOptions& options, ParallelGroups& groups, const ChatTemplate& tmpl,
                               const Tokenizer& tok, const ResponseGenerator& generate) {
  return run_regenerate(options, groups, tmpl, tok, serial_engine(generate));
}

}  // namespace aerie
