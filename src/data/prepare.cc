#include "data/prepare.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <iomanip>
#include <sstream>

#include <nlohmann/json.hpp>

#include "comm/communicator.h"
#include "core/agree.h"
#include "data/chat_templates.h"
#include "core/error.h"
#include "core/log.h"
#include "core/progress.h"
#include "core/version.h"
#include "io/fingerprint.h"
#include "io/h5.h"
#include "io/output_lock.h"

namespace aerie {

namespace fs = std::filesystem;

Overlong overlong_from_name(const std::string& name) {
  if (name == "truncate") return Overlong::Truncate;
  if (name == "drop") return Overlong::Drop;
  AERIE_THROW("unknown overlong policy '" << name << "' (truncate, drop)");
}

const char* overlong_name(Overlong o) { return o == Overlong::Truncate ? "truncate" : "drop"; }

bool apply_overlong(TokenizedSample& s, int64_t max_length, Overlong policy, bool* truncated) {
  if (truncated) *truncated = false;
  if (max_length <= 0 || static_cast<int64_t>(s.input_ids.size()) <= max_length) return true;
  if (policy == Overlong::Drop) return false;
  s.input_ids.resize(static_cast<size_t>(max_length));
  s.loss_mask.resize(static_cast<size_t>(max_length));
  if (truncated) *truncated = true;
  return true;
}

namespace {

// This rank's samples, concatenated, and what happened to each record read.
struct LocalSamples {
  std::vector<int32_t> ids;
  std::vector<uint8_t> mask;
  std::vector<int64_t> lengths;
  std::vector<uint8_t> truncated;
  std::vector<uint8_t> record_skip;   // SkipReason of each record read (None: became a sample)
  std::vector<std::pair<int64_t, std::string>> examples;  // (record index, "file:line: reason (detail)")
  // Records kept with a note (InputRecord::note): (record index, "file:line: note"), the text for the first few.
  std::vector<std::pair<int64_t, std::string>> notes;

  int64_t records() const { return static_cast<int64_t>(record_skip.size()); }
  std::array<int64_t, static_cast<size_t>(SkipReason::Count_)> skipped_by() const {
    std::array<int64_t, static_cast<size_t>(SkipReason::Count_)> n{};
    for (uint8_t r : record_skip) n[r] += r != 0;
    return n;
  }
  // Keeps the first n samples and forgets the records after the n-th sample, as a single reader that
  // stops after n samples would (so that --max-samples gives equal counts on any number of ranks).
  void keep_first(int64_t n) {
    int64_t tokens = 0;
    for (int64_t i = 0; i < n; ++i) tokens += lengths[static_cast<size_t>(i)];
    lengths.resize(static_cast<size_t>(n));
    truncated.resize(static_cast<size_t>(n));
    ids.resize(static_cast<size_t>(tokens));
    mask.resize(static_cast<size_t>(tokens));
    int64_t kept = 0, last = -1;  // last: index of the record that became sample n-1
    for (int64_t r = 0; r < records() && kept < n; ++r)
      if (record_skip[static_cast<size_t>(r)] == 0 && ++kept == n) last = r;
    record_skip.resize(static_cast<size_t>(last + 1));
    std::erase_if(examples, [&](const auto& e) { return e.first > last; });
    std::erase_if(notes, [&](const auto& e) { return e.first > last; });
  }
};

int64_t exscan(int64_t v, MPI_Comm comm) {
  int64_t out = 0;
  check_mpi(MPI_Exscan(&v, &out, 1, MPI_INT64_T, MPI_SUM, comm), "MPI_Exscan");
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  return rank == 0 ? 0 : out;
}

int64_t allsum(int64_t v, MPI_Comm comm) {
  check_mpi(MPI_Allreduce(MPI_IN_PLACE, &v, 1, MPI_INT64_T, MPI_SUM, comm), "MPI_Allreduce");
  return v;
}

// Concatenates the strings of all ranks on rank 0, in rank order (others get an empty vector).
std::vector<std::string> gather_strings(const std::vector<std::string>& mine, MPI_Comm comm) {
  int rank = 0, size = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  std::string buf;
  for (const auto& s : mine) buf += s + '\0';
  int n = static_cast<int>(buf.size());
  std::vector<int> counts(static_cast<size_t>(size)), displs(static_cast<size_t>(size));
  check_mpi(MPI_Gather(&n, 1, MPI_INT, counts.data(), 1, MPI_INT, 0, comm), "MPI_Gather");
  std::string all;
  if (rank == 0) {
    int total = 0;
    for (int r = 0; r < size; ++r) {
      displs[static_cast<size_t>(r)] = total;
      total += counts[static_cast<size_t>(r)];
    }
    all.resize(static_cast<size_t>(total));
  }
  check_mpi(MPI_Gatherv(buf.data(), n, MPI_CHAR, all.data(), counts.data(), displs.data(), MPI_CHAR, 0, comm),
            "MPI_Gatherv");
  std::vector<std::string> out;
  size_t p = 0;
  while (p < all.size()) {
    size_t e = all.find('\0', p);
    out.push_back(all.substr(p, e - p));
    p = e + 1;
  }
  return out;
}

// fsync of a file or folder; false on failure (errno set).
bool sync_path(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) return false;
  bool ok = ::fsync(fd) == 0;
  ::close(fd);
  return ok;
}

bool is_text_input(const PrepareOptions& opt) {
  if (opt.format == InputFormat::Text) return true;
  if (opt.format != InputFormat::Auto) return false;
  return fs::path(opt.input).extension() == ".txt";
}

// Notes of kept records (InputRecord::note) that each rank logs with their file:line, after the --max-samples
// cut (a record it drops gets none); the rest are counted.
constexpr size_t kNotesLogged = 5;

void log_notes(const LocalSamples& out) {
  for (size_t i = 0; i < out.notes.size() && i < kNotesLogged; ++i) AERIE_LOG(warning) << "prepare: " << out.notes[i].second;
  if (out.notes.size() > kNotesLogged)
    AERIE_LOG(warning) << "prepare: ... and " << out.notes.size() - kNotesLogged
                       << " more record(s) of this rank's part with such a warning (kept as said)";
}

// True when no assistant turn of `c` holds anything to train but its end of turn: empty (or blank) text, no
// ids, no tool calls, no reasoning text.
bool every_answer_empty(const Conversation& c) {
  const auto blank = [](const std::string& t) { return t.find_first_not_of(" \t\r\n") == std::string::npos; };
  for (const ChatTurn& t : c.turns)
    if (t.role == ChatRole::Assistant && (!blank(t.text) || !t.ids.empty() || !t.tool_calls.empty() || !blank(t.reasoning)))
      return false;
  return true;
}

// Tokenizes one parsed record and appends it to `out`, or counts it as skipped (`where`: "file:line").
void add_record(InputRecord r, const std::function<std::string()>& where, const PrepareOptions& opt,
              const Tokenizer& tok, const ChatTemplate& tmpl, LocalSamples& out) {
  // No rank ever needs more than max_samples of its own samples.
  if (opt.max_samples >= 0 && static_cast<int64_t>(out.lengths.size()) >= opt.max_samples) return;
  TokenizedSample s;
  bool truncated = false;
  if (r.skip == SkipReason::None && !r.tokenized && every_answer_empty(r.conversation)) {
    r.skip = SkipReason::EmptyAnswer;
    r.detail = "every assistant turn is empty: only its end of turn would be trained";
  }
  if (r.skip == SkipReason::None) {
    if (r.tokenized) {
      s.input_ids = std::move(r.input_ids);
      s.loss_mask = std::move(r.loss_mask);
    } else {
      try {
        // Regenerated responses carry the target's ids: kept where they decode to the turn's text (an
        // edited text falls back to encoding it), so that the sample holds what the target produced.
        for (ChatTurn& t : r.conversation.turns)
          if (!t.ids.empty() && tok.decode(t.ids) != t.text) t.ids.clear();
        s = tmpl.apply(r.conversation, tok);
      } catch (const Error& e) {
        r.skip = SkipReason::WrongTypes;
        r.detail = e.what();
      }
    }
  }
  if (r.skip == SkipReason::None) {
    if (!apply_overlong(s, opt.max_length, opt.overlong, &truncated)) {
      r.skip = SkipReason::Overlong;
      r.detail = std::to_string(s.input_ids.size()) + " tokens > max_length " + std::to_string(opt.max_length);
    } else if (s.loss_tokens() == 0) {
      r.skip = SkipReason::ZeroLoss;
      r.detail = truncated ? "no assistant token within the first " + std::to_string(opt.max_length) + " tokens"
                           : "no assistant token";
    } else if (s.input_ids.empty()) {
      r.skip = SkipReason::Empty;
      r.detail = "no tokens";
    }
  }
  out.record_skip.push_back(static_cast<uint8_t>(r.skip));
  if (r.skip == SkipReason::None && !r.note.empty())
    out.notes.emplace_back(out.records() - 1, out.notes.size() < kNotesLogged ? where() + ": " + r.note : std::string());
  if (r.skip != SkipReason::None) {
    if (static_cast<int>(out.examples.size()) < opt.max_reported) {
      std::ostringstream os;
      os << where() << ": " << skip_name(r.skip);
      if (!r.detail.empty()) os << " (" << r.detail << ")";
      out.examples.emplace_back(out.records() - 1, os.str());
    }
    return;
  }
  out.ids.insert(out.ids.end(), s.input_ids.begin(), s.input_ids.end());
  out.mask.insert(out.mask.end(), s.loss_mask.begin(), s.loss_mask.end());
  out.lengths.push_back(static_cast<int64_t>(s.input_ids.size()));
  out.truncated.push_back(truncated);
}

// Reads and tokenizes this rank's part of the input: a byte range of JSONL lines or text stories, or a
// range of the elements of a JSON array file.
LocalSamples read_local(const PrepareOptions& opt, const Tokenizer& tok, const ChatTemplate& tmpl, bool text,
                        bool array, int rank, int size, MPI_Comm comm) {
  LocalSamples out;
  const int64_t vocab = tok.vocab_size();
  const std::string file_name = fs::path(opt.input).filename().string();
  if (array) {
    Progress progress("prepare", "records of rank 0", 0, rank);  // the job's totals follow
    for_each_array_record(opt.input, opt.format, vocab, rank, size, [&](InputRecord&& r, int64_t index) {
      progress.add(1);
      add_record(std::move(r), [&] { return file_name + "[" + std::to_string(index) + "]"; }, opt, tok, tmpl, out);
    });
    progress.finish();
    return out;
  }
  InputRange range = input_range(opt.input, text, rank, size);
  const int64_t line0 = exscan(range.lines, comm);
  Progress progress("prepare", "MiB of rank 0's part", static_cast<double>(range.end - range.begin) / (1 << 20), rank);
  int64_t last_bytes = 0;
  for_each_record(opt.input, range, text, [&](const std::string& rec, int64_t line, int64_t bytes) {
    progress.add(static_cast<double>(bytes - last_bytes) / (1 << 20));
    last_bytes = bytes;
    if (opt.max_samples >= 0 && static_cast<int64_t>(out.lengths.size()) >= opt.max_samples) return;  // no parsing
    InputRecord r = text ? parse_story(rec) : parse_json_record(rec, opt.format, vocab);
    add_record(std::move(r), [&] { return file_name + ":" + std::to_string(line0 + line + 1); }, opt, tok, tmpl, out);
  });
  progress.finish();
  return out;
}

}  // namespace

std::string tokenizer_probe(const Tokenizer& tok) {
  static const char* const kProbe =
      "The quick brown fox jumps over the lazy dog. def f(x):\n    return x ** 2  # 1234567890\n"
      "Caf\u00e9 na\u00efve \u00fcber, \u4f60\u597d\u4e16\u754c, \U0001F600 <|im_start|> [INST]";
  const std::vector<int32_t> ids = tok.encode(kProbe);
  std::string bytes(ids.size() * sizeof(int32_t), '\0');
  if (!ids.empty()) std::memcpy(bytes.data(), ids.data(), bytes.size());
  return sha256_hex(bytes).substr(0, 16);
}

namespace {

std::string canonical_or_given(const std::string& p) {
  std::error_code ec;
  const fs::path c = fs::weakly_canonical(p, ec);
  return ec ? p : c.string();
}

// The files whose bytes decide the output besides the settings: the input, the tokenizer's, a template file.
std::vector<fs::path> prepare_input_files(const PrepareOptions& o) {
  std::vector<fs::path> files = {o.input};
  if (fs::is_directory(o.tokenizer)) {
    for (const char* name : {"tokenizer.json", "tokenizer_config.json", "tiktoken.model", "special_tokens_map.json"})
      if (fs::exists(fs::path(o.tokenizer) / name)) files.push_back(fs::path(o.tokenizer) / name);
  } else {
    files.emplace_back(o.tokenizer);
  }
  // The template's .ini, named or given as a path (a named one updated by a git pull counts too); "plain"
  // and names that resolve to nothing have no file.
  if (o.chat_template != "plain") {
    try {
      files.emplace_back(find_chat_template(o.chat_template));
    } catch (const Error&) {
    }
  }
  return files;
}

}  // namespace

std::string prepare_settings(const PrepareOptions& o) {
  std::error_code ec;
  const auto bytes = fs::file_size(o.input, ec);
  AERIE_CHECK(!ec, "prepare: input " << o.input << ": " << ec.message());
  // Contents, not times: a re-pasted `cp` of the same input (the README's block) is the same input.
  std::string template_sha256;
  if (o.chat_template != "plain") {
    try {
      template_sha256 = sha256_file(find_chat_template(o.chat_template));
    } catch (const Error&) {  // no such template: make_chat_template names it
    }
  }
  const nlohmann::ordered_json j = {
      {"input", canonical_or_given(o.input)},
      {"input_bytes", static_cast<int64_t>(bytes)},
      {"input_sha256", sha256_file(o.input)},
      {"template_sha256", template_sha256},
      {"format", input_format_name(o.format)},
      {"tokenizer", canonical_or_given(o.tokenizer)},
      {"template", fs::is_regular_file(o.chat_template) ? canonical_or_given(o.chat_template) : o.chat_template},
      {"max_length", o.max_length},
      {"overlong", overlong_name(o.overlong)},
      {"max_samples", o.max_samples}};
  return j.dump();
}

PreparedFileState prepared_file_state(const PrepareOptions& o) {
  auto outdated = [](std::string why) { return PreparedFileState{PreparedFileState::Outdated, std::move(why)}; };
  std::string recorded, probe;
  nlohmann::json legacy;  // the attributes an older aerie recorded, when there are no settings
  // The tokenizer's ids on the probe text (its files' contents are not hashed: a model folder re-downloaded
  // or copied is the same tokenizer), and, for a file that records no contents hashes (an older aerie's),
  // the input, tokenizer and template files against the file's time (make's rule).
  auto files_changed = [&](bool by_time) -> std::string {
    const auto written = fs::last_write_time(o.output);
    for (const fs::path& p : by_time ? prepare_input_files(o) : std::vector<fs::path>{}) {
      std::error_code ec;
      const auto t = fs::last_write_time(p, ec);
      if (!ec && t > written) return "the file " + p.string() + " is newer than it";
    }
    if (!probe.empty()) {
      const std::string now = tokenizer_probe(*Tokenizer::load(o.tokenizer));
      if (now != probe)
        return "--tokenizer " + o.tokenizer + " gives other ids than the tokenizer it was prepared with (tokenizer_probe " +
               now + ", the file: " + probe + ")";
    }
    return "";
  };
  {
    h5::File f = h5::File::open(o.output);
    AERIE_CHECK(f.has_attr("format") && f.string_attr("format") == kPreparedFormat,
                "prepare: " << o.output << " is not a prepared file (no format attribute \"" << kPreparedFormat << "\")");
    if (f.has_attr("tokenizer_probe")) probe = f.string_attr("tokenizer_probe");
    if (f.has_attr("settings")) {
      recorded = f.string_attr("settings");
    } else {
      for (const char* k : {"source", "tokenizer", "template", "overlong"})
        if (f.has_attr(k)) legacy[k] = f.string_attr(k);
      if (f.has_attr("max_length")) legacy["max_length"] = f.int_attr("max_length");
    }
  }
  const nlohmann::json mine = nlohmann::json::parse(prepare_settings(o));
  if (recorded.empty()) {
    // An older aerie's file: its recorded paths as that run gave them, the template by name.
    const std::vector<std::pair<std::string, std::string>> older = {
        {"source", "--input"}, {"tokenizer", "--tokenizer"}, {"template", "--template"},
        {"max_length", "--max-length"}, {"overlong", "--overlong"}};
    for (const auto& [key, name] : older) {
      if (!legacy.contains(key)) continue;
      const nlohmann::json& t = legacy[key];
      nlohmann::json m;
      if (key == "source") m = canonical_or_given(o.input);
      if (key == "tokenizer") m = canonical_or_given(o.tokenizer);
      if (key == "template") m = fs::path(o.chat_template).stem().string();
      if (key == "max_length") m = o.max_length;
      if (key == "overlong") m = overlong_name(o.overlong);
      const nlohmann::json tt = key == "source" || key == "tokenizer" ? nlohmann::json(canonical_or_given(t.get<std::string>())) : t;
      if (m != tt && !(key == "template" && t == o.chat_template))
        return outdated(name + " " + m.dump() + " (the file, written by an older aerie: " + t.dump() + ")");
    }
    if (const std::string why = files_changed(true); !why.empty()) return outdated(why);
    return {PreparedFileState::Legacy, "written by an older aerie, which recorded no settings; those it recorded match"};
  }
  const nlohmann::json theirs = nlohmann::json::parse(recorded, nullptr, false);
  if (theirs.is_discarded() || !theirs.is_object()) return outdated("its settings attribute is not JSON");
  static const std::vector<std::pair<std::string, std::string>> option = {
      {"input", "--input"},
      {"input_bytes", "the input's size in bytes"},
      {"input_sha256", "--input's contents (sha256)"},
      {"format", "--format"},
      {"tokenizer", "--tokenizer"},
      {"template", "--template"},
      {"template_sha256", "--template's file contents (sha256)"},
      {"max_length", "--max-length"},
      {"overlong", "--overlong"},
      {"max_samples", "--max-samples"}};
  // Settings written by an aerie before the contents hashes fall back to the times.
  const bool hashed = theirs.contains("input_sha256");
  for (const auto& [key, name] : option) {
    if (!hashed && (key == "input_sha256" || key == "template_sha256")) continue;
    const nlohmann::json t = theirs.contains(key) ? theirs[key] : nlohmann::json();
    if (mine[key] != t)
      return outdated(name + " " + mine[key].dump() + " (the file: " + (t.is_null() ? "not recorded" : t.dump()) + ")");
  }
  if (const std::string why = files_changed(!hashed); !why.empty()) return outdated(why);
  return {PreparedFileState::UpToDate, ""};
}

namespace {

// Where this rank's samples go in the prepared file, and what the file records about the run.
struct PreparedLayout {
  int64_t tok_off = 0, sample_off = 0;  // this rank's first token and first sample
  std::string settings;                 // the settings attribute (prepare_settings)
  bool text = false;                    // plain-text input
};

// Writes the prepared file `tmp` collectively over comm: every rank its samples (`local`) at its offsets,
// the totals and attributes of `st`. A failure on any rank (a full disk) throws aerie::CollectiveError on
// every rank (io/h5.h).
void write_prepared_tmp(const std::string& tmp, const PrepareOptions& opt, const LocalSamples& local,
                        const PrepareStats& st, const PreparedLayout& at, const Tokenizer& tok,
                        const ChatTemplate& tmpl, MPI_Comm comm) {
  int rank = 0, size = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  const int64_t n_local = static_cast<int64_t>(local.lengths.size());
  const int64_t tok_local = static_cast<int64_t>(local.ids.size());
  const int64_t tok_off = at.tok_off, sample_off = at.sample_off;
  h5::File f = h5::File::create(tmp, comm);
  std::vector<int64_t> offsets(static_cast<size_t>(n_local));
  int64_t acc = tok_off;
  for (int64_t i = 0; i < n_local; ++i) {
    offsets[static_cast<size_t>(i)] = acc;
    acc += local.lengths[static_cast<size_t>(i)];
  }
  if (rank == size - 1) offsets.push_back(st.tokens);  // off[N] = N_tok
  {
    // Every element gets written: no fill pass; no object times, so equal runs give equal bytes.
    const h5::DatasetOptions o{.track_times = false, .fill = false};
    h5::Dataset ids = f.create_dataset("input_ids", DType::I32, {st.tokens}, o);
    // Tensor::wrap takes a mutable pointer; the writes only read it.
    ids.write_rows(tok_off, Tensor::wrap(const_cast<int32_t*>(local.ids.data()), {tok_local}, DType::I32));
    h5::Dataset mask = f.create_dataset("loss_mask", DType::U8, {st.tokens}, o);
    mask.write_rows(tok_off, Tensor::wrap(const_cast<uint8_t*>(local.mask.data()), {tok_local}, DType::U8));
    h5::Dataset off = f.create_dataset("sample_offsets", DType::I64, {st.samples + 1}, o);
    off.write_rows(sample_off, Tensor::wrap(offsets.data(), {static_cast<int64_t>(offsets.size())}, DType::I64));
  }
  f.set_string_attr("format", kPreparedFormat);
  f.set_int_attr("format_version", kPreparedVersion);
  f.set_string_attr("aerie_version", aerie_version_string());
  f.set_string_attr("tokenizer", opt.tokenizer);
  f.set_string_attr("tokenizer_probe", tokenizer_probe(tok));
  f.set_string_attr("template", tmpl.name());
  f.set_int_attr("max_length", opt.max_length);
  f.set_string_attr("overlong", overlong_name(opt.overlong));
  f.set_int_attr("num_samples", st.samples);
  f.set_int_attr("num_tokens", st.tokens);
  f.set_int_attr("num_loss_tokens", st.loss_tokens);
  f.set_string_attr("source", opt.input);
  f.set_string_attr("input_format", at.text ? "text" : input_format_name(opt.format));
  f.set_int_attr("bos_id", tok.bos_id());
  f.set_int_attr("eos_id", tok.eos_id());
  f.set_int_attr("vocab_size", tok.vocab_size());
  f.set_int_attr("num_skipped", st.skipped);
  f.set_int_attr("num_truncated", st.truncated);
  f.set_string_attr("settings", at.settings);
  f.close();
}

// The bytes of the prepared file of `st`: 4 (input_ids) + 1 (loss_mask) a token, 8 a sample offset, and 64 KiB
// for HDF5's metadata and the attributes (a settings string of a few KiB).
int64_t prepared_file_bytes(const PrepareStats& st) { return 5 * st.tokens + 8 * (st.samples + 1) + (int64_t{64} << 10); }

// Why `output` cannot be written, or "": its file system has less free space than the file needs (checked
// before the file is created: a full disk under a collective write is caught too, but space is known now).
std::string space_refusal(const std::string& output, const PrepareStats& st) {
  std::error_code ec;
  fs::path where = fs::absolute(output, ec).parent_path();
  while (!where.empty() && !fs::exists(where, ec) && where != where.parent_path()) where = where.parent_path();
  const fs::space_info si = fs::space(where, ec);
  const int64_t need = prepared_file_bytes(st);
  if (ec || static_cast<int64_t>(si.available) >= need) return "";
  auto mib = [](int64_t b) {
    std::ostringstream os;
    os << std::fixed << std::setprecision(2) << static_cast<double>(b) / (1024.0 * 1024.0) << " MiB";
    return os.str();
  };
  std::ostringstream os;
  os << "prepare: --output " << output << " needs about " << mib(need) << " (" << st.tokens << " tokens x 5 bytes, "
     << st.samples << " samples) but " << where.string() << " has " << mib(static_cast<int64_t>(si.available))
     << " free: free space there, choose another --output, keep fewer samples (--max-samples), or pass "
     << "--no-space-check to start anyway";
  return os.str();
}

// The error of a prepared file that could not be written: its path, the --output, the free space of its
// file system (on the rank that removes the partial file), the failure, and what to do.
std::string write_failure_message(const std::string& tmp, const std::string& output, const std::string& what,
                                  bool remove) {
  std::ostringstream os;
  os << "prepare: cannot write " << tmp << " (the --output " << output << " while it is written)";
  if (remove) {
    std::error_code ec;
    const fs::path parent = fs::path(tmp).parent_path();
    const fs::space_info sp = fs::space(parent.empty() ? fs::path(".") : parent, ec);
    if (!ec) os << ", " << sp.available / (1024 * 1024) << " MiB free on its file system";
    fs::remove(tmp, ec);
  }
  os << ": " << what << ". The partial file is removed; make room there (a full disk?) or choose another "
     << "--output, and run prepare again";
  return os.str();
}

}  // namespace

namespace {

// Rank 0's first lines: the input, tokenizer, template and limits; a warning for each think marker of a
// thinking template that is no token of the tokenizer.
void log_prepare_start(const PrepareOptions& opt, bool text, int size, const Tokenizer& tok,
                       const ChatTemplate& tmpl) {
  AERIE_LOG(info) << "prepare: input " << opt.input << " (format "
                  << (text ? "text" : input_format_name(opt.format)) << ", " << fs::file_size(opt.input)
                  << " bytes, " << size << " rank(s)), tokenizer " << opt.tokenizer << " (vocab "
                  << tok.vocab_size() << ", bos " << tok.bos_id() << ", eos " << tok.eos_id()
                  << "), template " << tmpl.name() << ", max_length " << opt.max_length << ", overlong "
                  << overlong_name(opt.overlong)
                  << (opt.overlong == Overlong::Truncate ? " (keep the first max_length tokens)"
                                                         : " (drop longer samples)")
                  << (opt.max_samples >= 0 ? ", max_samples " + std::to_string(opt.max_samples) : "");
  // A thinking template's think markers are tokens of its model's tokenizer (K2-Thinking / K2.5: <think> is
  // 163606); with another model's tokenizer (K2-Instruct's has no such token) they become several text
  // tokens, a sequence the target never writes.
  if (const auto* ct = dynamic_cast<const ConfigChatTemplate*>(&tmpl); ct && ct->spec().reasoning != "none") {
    for (const std::string& marker : {ct->spec().think_begin, ct->spec().think_end}) {
      const size_t b = marker.find_first_not_of(" \n"), e = marker.find_last_not_of(" \n");
      const std::string m = b == std::string::npos ? marker : marker.substr(b, e - b + 1);
      if (!m.empty() && tok.token_to_id(m) < 0)
        AERIE_LOG(warning) << "prepare: " << m << " of template " << tmpl.name() << " is no token of "
                           << opt.tokenizer << " (it becomes " << tok.encode(m).size() << " text tokens): "
                           << "is this the tokenizer of the model you train for (K2-Thinking and K2.5 have "
                           << "<think> / </think> as tokens, K2-Instruct has not)?";
    }
  }
}

// Rank 0: keeps the first opt.max_reported skipped records' `examples` (each led by its SkipReason's
// digit) in st.examples and logs the counts and the skips (text input's single-sentence paragraphs, the
// normal case, in one info line; every other skip a warning).
void report_skips(PrepareStats& st, std::vector<std::string> examples, const PrepareOptions& opt, bool text) {
  if (static_cast<int>(examples.size()) > opt.max_reported) examples.resize(static_cast<size_t>(opt.max_reported));
  std::vector<SkipReason> reasons;
  for (auto& e : examples) {
    reasons.push_back(static_cast<SkipReason>(e[0] - '0'));
    e.erase(0, 1);
  }
  st.examples = examples;
  std::ostringstream why;
  for (size_t i = 1; i < st.skipped_by.size(); ++i)
    if (st.skipped_by[i]) why << (why.tellp() > 0 ? ", " : "") << skip_name(static_cast<SkipReason>(i)) << " " << st.skipped_by[i];
  AERIE_LOG(info) << "prepare: " << st.records << " records read, " << st.samples << " samples kept, "
                  << st.skipped << " skipped" << (st.skipped ? " (" + why.str() + ")" : "") << ", " << st.truncated
                  << " truncated to " << opt.max_length << " tokens";
  // Text input: a paragraph of one sentence is the prompt with nothing to answer; skipping it is the
  // normal case (about one TinyStories paragraph in ten), so those skips get one info line. Every other
  // skip stays a warning with its file:line.
  const int64_t expected = text ? st.skipped_by[static_cast<size_t>(SkipReason::NoRest)] : 0;
  std::string where_expected;
  int64_t warned = 0, listed = 0;
  for (size_t i = 0; i < st.examples.size(); ++i) {
    if (text && reasons[i] == SkipReason::NoRest) {
      const std::string& e = st.examples[i];  // "file:line: single sentence (...)"
      const std::string where = e.substr(0, e.rfind(std::string(": ") + skip_name(SkipReason::NoRest)));
      if (listed++ < 3) where_expected += (where_expected.empty() ? "" : ", ") + where;
    } else {
      AERIE_LOG(warning) << "prepare: skipped " << st.examples[i];
      ++warned;
    }
  }
  if (expected > 0)
    AERIE_LOG(info) << "prepare: " << expected << " single-sentence paragraph(s) skipped, as expected for text "
                    << "input (the first sentence is the prompt, nothing is left to answer)"
                    << (where_expected.empty() ? "" : "; e.g. " + where_expected);
  if (st.skipped - expected > warned)
    AERIE_LOG(warning) << "prepare: ... and " << st.skipped - expected - warned << " more skipped records";
}

}  // namespace

PrepareStats run_prepare(const PrepareOptions& opt, MPI_Comm comm) {
  int rank = 0, size = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  AERIE_CHECK(fs::is_regular_file(opt.input), "prepare: input " << opt.input << " is not a readable file");
  AERIE_CHECK(!opt.output.empty(), "prepare: no output path");
  AERIE_CHECK(opt.max_length > 0, "prepare: max_length must be positive, got " << opt.max_length);
  // The file's settings attribute (it hashes the input): rank 0 reads it once and tells the others.
  std::string settings = rank == 0 ? prepare_settings(opt) : std::string();
  int64_t settings_len = static_cast<int64_t>(settings.size());
  check_mpi(MPI_Bcast(&settings_len, 1, MPI_INT64_T, 0, comm), "MPI_Bcast");
  settings.resize(static_cast<size_t>(settings_len));
  check_mpi(MPI_Bcast(settings.data(), static_cast<int>(settings_len), MPI_CHAR, 0, comm), "MPI_Bcast");
  // OUTPUT.lock on rank 0 while the ranks write OUTPUT.tmp, unless the job holds it already (io/output_lock.h).
  const OutputLock lock = acquire_output_lock(comm, opt.output, LockTarget::File, "prepare");
  bool text = is_text_input(opt);
  AERIE_CHECK(!(text && opt.format == InputFormat::Tokenized), "prepare: tokenized input must be JSONL");
  std::unique_ptr<Tokenizer> tok = Tokenizer::load(opt.tokenizer);
  std::unique_ptr<ChatTemplate> tmpl = make_chat_template(opt.chat_template, *tok);
  if (rank == 0) log_prepare_start(opt, text, size, *tok, *tmpl);

  const bool array = !text && is_json_array_file(opt.input);
  LocalSamples local = read_local(opt, *tok, *tmpl, text, array, rank, size, comm);

  // Input order: rank r's samples follow those of ranks < r. --max-samples keeps the first N overall.
  int64_t n_local = static_cast<int64_t>(local.lengths.size());
  int64_t sample_off = exscan(n_local, comm);  // before the --max-samples cut
  if (opt.max_samples >= 0 && sample_off + n_local >= opt.max_samples)
    local.keep_first(std::clamp<int64_t>(opt.max_samples - sample_off, 0, n_local));
  log_notes(local);
  n_local = static_cast<int64_t>(local.lengths.size());
  sample_off = exscan(n_local, comm);  // after the cut
  int64_t tok_local = static_cast<int64_t>(local.ids.size());
  int64_t tok_off = exscan(tok_local, comm);

  PrepareStats st;
  st.samples = allsum(n_local, comm);
  st.tokens = allsum(tok_local, comm);
  int64_t loss_local = 0, trunc_local = 0;
  for (uint8_t m : local.mask) loss_local += m != 0;
  for (uint8_t t : local.truncated) trunc_local += t;
  st.loss_tokens = allsum(loss_local, comm);
  st.truncated = allsum(trunc_local, comm);
  st.records = allsum(local.records(), comm);
  const auto skipped_local = local.skipped_by();
  check_mpi(MPI_Allreduce(skipped_local.data(), st.skipped_by.data(), static_cast<int>(st.skipped_by.size()),
                          MPI_INT64_T, MPI_SUM, comm),
            "MPI_Allreduce");
  for (int64_t n : st.skipped_by) st.skipped += n;
  // Each example travels with its SkipReason as a leading byte, taken off again on rank 0.
  std::vector<std::string> mine;
  for (const auto& e : local.examples)
    mine.push_back(static_cast<char>('0' + local.record_skip[static_cast<size_t>(e.first)]) + e.second);
  std::vector<std::string> examples = gather_strings(mine, comm);
  if (rank == 0) report_skips(st, std::move(examples), opt, text);
  // st.samples is a world sum, the same on every rank: every rank ends the job together, no MPI_Abort.
  if (st.samples == 0) {
    std::ostringstream os;
    os << "prepare: no usable sample in " << opt.input << " (" << st.records << " records, " << st.skipped
       << " skipped; see the log)";
    throw CollectiveError(os.str());
  }

  // Write "<output>.tmp" collectively, then rename it on rank 0.
  std::string tmp = opt.output + ".tmp";
  if (rank == 0) {
    fs::path parent = fs::path(opt.output).parent_path();
    if (!parent.empty()) fs::create_directories(parent);
  }
  // Rank 0 checks the free space; every rank learns its refusal (no file is created then). The all-reduce
  // also keeps the other ranks from creating the file before rank 0 made its folder.
  agree_on_failure(comm, rank == 0 && opt.space_check ? space_refusal(opt.output, st) : std::string());
  try {
    write_prepared_tmp(tmp, opt, local, st, {tok_off, sample_off, settings, text}, *tok, *tmpl, comm);
  } catch (const CollectiveError& e) {
    // Every rank failed together (io/h5.h: the ranks agree on each collective write), so none waits in
    // a collective: the message names the file, rank 0 removes it (a full disk gets its space back when the
    // job ends) and every rank ends the job.
    throw CollectiveError(write_failure_message(tmp, opt.output, e.what(), rank == 0));
  }
  MPI_Barrier(comm);
  int ok = 1;
  std::string err;
  if (rank == 0) {
    // Durable before visible: sync the data, rename, sync the folder.
    if (!sync_path(tmp)) {
      ok = 0;
      err = std::string("fsync failed: ") + std::strerror(errno);
    }
    std::error_code ec;
    if (ok) fs::rename(tmp, opt.output, ec);
    if (ec) {
      ok = 0;
      err = ec.message();
    }
    fs::path parent = fs::path(opt.output).parent_path();
    if (ok) sync_path(parent.empty() ? "." : parent.string());
  }
  check_mpi(MPI_Bcast(&ok, 1, MPI_INT, 0, comm), "MPI_Bcast");
  if (!ok)  // known on every rank: a clean end of the job, not an abort
    throw CollectiveError("prepare: cannot rename " + tmp + " to " + opt.output + (err.empty() ? "" : ": " + err));
  if (rank == 0) {
    AERIE_LOG(info) << "prepare: wrote " << opt.output << ": " << st.samples << " samples, " << st.tokens
                    << " tokens (mean " << st.tokens / std::max<int64_t>(1, st.samples) << " per sample), "
                    << st.loss_tokens << " loss-masked tokens ("
                    << (st.tokens ? 100.0 * static_cast<double>(st.loss_tokens) / static_cast<double>(st.tokens) : 0.0)
                    << "%)";
  }
  return st;
}

}  // namespace aerie
