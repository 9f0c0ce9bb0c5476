// Regeneration of assistant turns (see regenerate.h): one record, the input index, chunk dispatch and output.
#include "data/regenerate.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <deque>
#include <filesystem>
#include <fstream>
#include <memory>

#include "core/error.h"
#include "core/log.h"
#include "core/progress.h"

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

bool is_blank(const std::string& s) {
  return std::all_of(s.begin(), s.end(), [](char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n'; });
}

// An assistant message whose content is a tool call (kept verbatim).
bool has_tool_call(const ojson& m, InputFormat f) {
  if (f == InputFormat::ShareGPT) return m.value("from", "") == "function_call";
  return m.contains("tool_calls") && !m["tool_calls"].is_null() && !(m["tool_calls"].is_array() && m["tool_calls"].empty());
}

}  // namespace

RegeneratedRecord regenerate_record(const std::string& record, InputFormat format, int64_t index,
                                    const ChatTemplate& tmpl, const Tokenizer& tok, const RegenerateParams& params,
                                    const ResponseGenerator& generate) {
  if (is_blank(record)) return dropped(SkipReason::Empty, "blank line");
  ojson j = ojson::parse(record, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return dropped(SkipReason::BadJson, "not a JSON object");
  InputFormat f = format;
  if (f == InputFormat::Auto) {
    if (j.contains("conversations")) f = InputFormat::ShareGPT;
    else if (j.contains("messages")) f = InputFormat::OpenAI;
    else return dropped(SkipReason::WrongTypes, "none of the keys 'conversations', 'messages'");
  }
  AERIE_CHECK(f == InputFormat::ShareGPT || f == InputFormat::OpenAI,
              "generate: input format " << input_format_name(f) << " has no conversations to regenerate "
                                        << "(use sharegpt, openai or auto)");
  const bool sharegpt = f == InputFormat::ShareGPT;
  const char* key = sharegpt ? "conversations" : "messages";
  if (!j.contains(key) || !j[key].is_array()) return dropped(SkipReason::WrongTypes, std::string("no '") + key + "' array");

  // prepare's reader, with an empty assistant turn appended so that prompt-only records parse too.
  ojson probe = j;
  probe[key].push_back(sharegpt ? ojson{{"from", "gpt"}, {"value", ""}} : ojson{{"role", "assistant"}, {"content", ""}});
  InputRecord rec = parse_json_record(probe.dump(-1, ' ', false, ojson::error_handler_t::replace), f, tok.vocab_size());
  if (rec.skip != SkipReason::None) return dropped(rec.skip, rec.detail);
  std::vector<ChatTurn> turns = std::move(rec.conversation.turns);
  turns.pop_back();
  const ojson& msgs = j[key];
  const size_t offset = turns.size() - msgs.size();  // a ShareGPT top-level "system" is turn 0
  AERIE_CHECK(turns.size() >= msgs.size() && offset <= 1, "generate: record " << index << ": " << turns.size()
                                                          << " parsed turns for " << msgs.size() << " messages");

  RegeneratedRecord out;
  Conversation so_far = rec.conversation;  // keeps whatever else the reader stores (tools)
  so_far.turns.clear();
  ojson new_msgs = ojson::array();
  size_t answered = 0;  // messages up to and including the last assistant message
  // The target's response to so_far, or false when the prompt leaves no room under max_length.
  auto respond = [&](std::string& text) {
    std::vector<int32_t> prompt = generation_prompt(tmpl, so_far, tok);
    const int64_t room = std::min(params.max_new_tokens, params.max_length - static_cast<int64_t>(prompt.size()));
    if (room < 1 || prompt.empty()) return false;
    std::vector<int32_t> ids = generate(prompt, room, index, out.responses);
    out.responses += 1;
    out.prompt_tokens += static_cast<int64_t>(prompt.size());
    out.new_tokens += static_cast<int64_t>(ids.size());
    if (!ids.empty() && std::find(params.stop_ids.begin(), params.stop_ids.end(), ids.back()) != params.stop_ids.end())
      ids.pop_back();
    text = tok.decode(ids);
    ChatTurn turn{};
    turn.role = ChatRole::Assistant;
    turn.text = text;
    so_far.turns.push_back(std::move(turn));
    return true;
  };
  for (size_t i = 0; i < turns.size(); ++i) {
    const ojson* src = i >= offset ? &msgs[i - offset] : nullptr;
    if (turns[i].role == ChatRole::Assistant && src && !has_tool_call(*src, f)) {
      std::string text;
      if (!respond(text)) {
        out.truncated = true;
        break;
      }
      ojson m = *src;
      if (sharegpt) {
        m["value"] = text;
      } else {
        m["content"] = text;
        for (const char* k : {"reasoning_content", "reasoning", "thinking"}) m.erase(k);  // not the target's
      }
      new_msgs.push_back(std::move(m));
      answered = new_msgs.size();
    } else {
      so_far.turns.push_back(turns[i]);
      if (src) new_msgs.push_back(*src);
      if (turns[i].role == ChatRole::Assistant) answered = new_msgs.size();
    }
  }
  // Cut short: the record ends with its last answer (no unanswered user turn left at the end).
  if (out.truncated) new_msgs.erase(new_msgs.begin() + static_cast<std::ptrdiff_t>(answered), new_msgs.end());
  const bool open_end = !turns.empty() && (turns.back().role == ChatRole::User || turns.back().role == ChatRole::Tool);
  if (!out.truncated && open_end) {
    std::string text;
    if (respond(text)) {
      new_msgs.push_back(sharegpt ? ojson{{"from", "gpt"}, {"value", text}} : ojson{{"role", "assistant"}, {"content", text}});
    } else {
      out.truncated = true;
    }
  }
  if (out.responses == 0) {
    RegeneratedRecord d = out.truncated ? dropped(SkipReason::Overlong, "the first prompt leaves no room under max_length")
                                        : dropped(SkipReason::NoAssistant, "no turn to answer");
    d.truncated = out.truncated;
    return d;
  }
  j[key] = std::move(new_msgs);
  out.json = j.dump(-1, ' ', false, ojson::error_handler_t::replace);  // a response cut mid-character: U+FFFD
  out.ok = true;
  return out;
}

// ------------------------------------------------------------------------------------------------ the run

namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// The records of the input: JSONL lines by byte offset, or the elements of a JSON array.
class InputIndex {
 public:
  explicit InputIndex(const std::string& path) : path_(path) {
    AERIE_CHECK(fs::is_regular_file(path), "generate: input " << path << ": no such file");
    if (is_json_array_file(path)) {
      std::ifstream in(path);
      array_ = ojson::parse(in, nullptr, false);
      AERIE_CHECK(!array_.is_discarded() && array_.is_array(), "generate: " << path << " is not one valid JSON array");
      size_ = static_cast<int64_t>(array_.size());
      return;
    }
    std::ifstream in(path, std::ios::binary);
    AERIE_CHECK(in, "generate: cannot open " << path);
    std::string line;
    int64_t pos = 0;
    while (std::getline(in, line)) {
      offsets_.push_back(pos);
      pos += static_cast<int64_t>(line.size()) + 1;
    }
    size_ = static_cast<int64_t>(offsets_.size());
  }
  int64_t size() const { return size_; }
  /// Records [b, e) as text.
  std::vector<std::string> read(int64_t b, int64_t e) const {
    std::vector<std::string> out;
    if (!offsets_.empty() || array_.is_null()) {
      std::ifstream in(path_, std::ios::binary);
      AERIE_CHECK(in, "generate: cannot open " << path_);
      if (b < e) in.seekg(offsets_[b]);
      std::string line;
      for (int64_t i = b; i < e; ++i) {
        AERIE_CHECK(std::getline(in, line), "generate: " << path_ << ": read error at line " << i + 1);
        out.push_back(line);
      }
    } else {
      for (int64_t i = b; i < e; ++i) out.push_back(array_[i].dump(-1, ' ', false, ojson::error_handler_t::replace));
    }
    return out;
  }

 private:
  std::string path_;
  ojson array_;  // null unless the input is a JSON array
  std::vector<int64_t> offsets_;
  int64_t size_ = 0;
};

// Rank 0's side of the work queue (the protocol of data/extract.h).
class Dispatcher {
 public:
  Dispatcher(MpiCommunicator& world, int num_leaders, std::deque<int64_t> todo, double total)
      : world_(world), others_(num_leaders - 1), todo_(std::move(todo)), progress_("generate", "conversations", total, 0) {}
  int64_t next() {
    if (todo_.empty()) return -1;
    int64_t c = todo_.front();
    todo_.pop_front();
    return c;
  }
  void serve_pending() {
    for (;;) {
      int flag = 0;
      MPI_Status st;
      check_mpi(MPI_Iprobe(MPI_ANY_SOURCE, kRegenerateRequestTag, world_.handle(), &flag, &st), "MPI_Iprobe");
      if (!flag) return;
      answer(st.MPI_SOURCE);
    }
  }
  void drain() {
    while (stopped_ < others_) answer(MPI_ANY_SOURCE);
  }
  void stop() {
    if (!todo_.empty()) AERIE_LOG(warning) << "generate: stopping, " << todo_.size() << " chunk(s) left for a rerun";
    todo_.clear();
  }
  void completed(int64_t records) { progress_.add(static_cast<double>(records)); }
  void finish() { progress_.finish(); }

 private:
  void answer(int src) {
    int from = -1;
    std::vector<int64_t> req = world_.recv(src, kRegenerateRequestTag, &from);
    AERIE_CHECK(req.size() == 3, "generate: malformed request from rank " << from);
    if (req[2] != 0) stop();
    if (req[1] > 0) completed(req[1]);
    int64_t c = next();
    if (c < 0) ++stopped_;
    world_.send({c}, from, kRegenerateReplyTag);
  }

  MpiCommunicator& world_;
  int others_, stopped_ = 0;
  std::deque<int64_t> todo_;
  Progress progress_;
};

std::string chunk_name(int64_t c) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "chunk-%05lld.jsonl", static_cast<long long>(c));
  return buf;
}

void write_file(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    AERIE_CHECK(out, "generate: cannot write " << tmp);
    out << text;
    out.flush();
    AERIE_CHECK(out, "generate: write error on " << tmp);
  }
  fs::rename(tmp, path);
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
    AERIE_CHECK(!old.is_discarded() && old == run,
                "generate: " << meta << " was written by another run (" << read_file(meta) << "; this run: "
                             << run.dump() << "). Remove " << parts << " or choose another --output.");
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

}  // namespace

RegenerateStats run_regenerate(const RegenerateOptions& opt, ParallelGroups& groups, const ChatTemplate& tmpl,
                               const Tokenizer& tok, const ResponseGenerator& generate) {
  const double t0 = now_s();
  const int64_t S = opt.conversations_per_chunk;
  AERIE_CHECK(S > 0, "generate: --conversations-per-chunk must be > 0, got " << S);
  AERIE_CHECK(opt.params.max_new_tokens > 0, "generate: --max-new-tokens must be > 0");
  MpiCommunicator& world = *groups.world;
  MpiCommunicator& tp = *groups.tp;
  const bool leader = tp.rank() == 0;

  InputIndex input(opt.input);
  RegenerateStats stats;
  stats.records = opt.max_conversations >= 0 ? std::min(opt.max_conversations, input.size()) : input.size();
  stats.chunks = (stats.records + S - 1) / S;
  const std::string parts = opt.output + ".parts";
  auto chunk_path = [&](int64_t c) { return (fs::path(parts) / chunk_name(c)).string(); };

  std::unique_ptr<Dispatcher> dispatcher;
  if (world.rank() == 0) {
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
                    << " group(s) of " << groups.map.tp << " rank(s)";
    dispatcher = std::make_unique<Dispatcher>(world, groups.map.dp, std::move(todo), todo_records);
  }

  int64_t skip_counts[static_cast<int>(SkipReason::Count_)] = {};
  auto process = [&](int64_t c) {
    const int64_t b = c * S, e = std::min(stats.records, (c + 1) * S);
    std::vector<std::string> records = input.read(b, e);
    std::string text;
    for (int64_t i = b; i < e; ++i) {
      RegeneratedRecord r = regenerate_record(records[i - b], opt.format, i, tmpl, tok, opt.params, generate);
      stats.responses += r.responses;
      stats.prompt_tokens += r.prompt_tokens;
      stats.new_tokens += r.new_tokens;
      stats.truncated += r.truncated ? 1 : 0;
      if (r.ok) {
        text += r.json;
        text += '\n';
        ++stats.conversations;
      } else {
        ++stats.dropped;
        ++skip_counts[static_cast<int>(r.skip)];
        if (leader && r.skip != SkipReason::Empty)
          AERIE_LOG(debug) << "generate: " << opt.input << " record " << i << " dropped: " << skip_name(r.skip)
                           << (r.detail.empty() ? "" : " (" + r.detail + ")");
      }
      if (dispatcher) dispatcher->serve_pending();
    }
    if (leader) write_file(chunk_path(c), text);
    ++stats.chunks_done;
    return e - b;
  };

  Tensor cmd = Tensor::zeros({1}, DType::I64);
  int64_t done_records = 0;
  bool stop_seen = false;
  for (;;) {
    int64_t c = -1;
    if (opt.stop_requested && opt.stop_requested()) stop_seen = true;
    if (leader) {
      if (dispatcher) {
        if (stop_seen) dispatcher->stop();
        dispatcher->serve_pending();
        c = dispatcher->next();
      } else {
        world.send({groups.map.dp_rank, done_records, stop_seen ? 1 : 0}, 0, kRegenerateRequestTag);
        c = world.recv(0, kRegenerateReplyTag).at(0);
      }
      cmd.data<int64_t>()[0] = c;
    }
    tp.broadcast(cmd, 0);
    c = cmd.data<int64_t>()[0];
    if (c < 0) break;
    done_records = process(c);
    if (dispatcher) dispatcher->completed(done_records);
  }
  if (dispatcher) dispatcher->drain();

  // World totals (leaders count their group's work); the all-reduce also waits for every group's files.
  auto own = [&](int64_t v) { return leader ? v : 0; };
  std::vector<int64_t> local = {own(stats.chunks_done), own(stats.conversations), own(stats.dropped),
                                own(stats.truncated), own(stats.responses),     own(stats.prompt_tokens),
                                own(stats.new_tokens), stop_seen ? 1 : 0};
  for (int64_t n : skip_counts) local.push_back(own(n));
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

  // Rank 0: every chunk present -> the output file.
  Tensor complete = Tensor::zeros({1}, DType::I64);
  if (world.rank() == 0) {
    bool all = true;
    for (int64_t c = 0; c < stats.chunks && all; ++c) all = fs::exists(chunk_path(c));
    if (all) {
      std::string text;
      for (int64_t c = 0; c < stats.chunks; ++c) text += read_file(chunk_path(c));
      write_file(opt.output, text);
      complete.data<int64_t>()[0] = 1;
    }
  }
  world.all_reduce_sum(complete);
  stats.complete = complete.data<int64_t>()[0] != 0;
  stats.seconds = now_s() - t0;
  if (dispatcher) {
    dispatcher->finish();
    std::string why;
    for (int s = 1; s < static_cast<int>(SkipReason::Count_); ++s)
      if (t[8 + s] > 0) why += std::string(why.empty() ? "" : ", ") + skip_name(static_cast<SkipReason>(s)) + " " +
                               std::to_string(t[8 + s]);
    AERIE_LOG(info) << "generate: " << stats.chunks_done << " chunk(s), " << stats.conversations << " conversations, "
                    << stats.responses << " responses, " << stats.new_tokens << " new tokens (" << stats.prompt_tokens
                    << " prompt tokens) in " << stats.seconds << " s ("
                    << (stats.seconds > 0 ? stats.new_tokens / stats.seconds : 0) << " new tokens/s); dropped "
                    << stats.dropped << (why.empty() ? "" : " (" + why + ")") << ", cut short " << stats.truncated;
    if (stats.complete) AERIE_LOG(info) << "generate: wrote " << opt.output;
  }
  return stats;
}

}  // namespace aerie
