#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <sstream>
#include <vector>

#include <mpi.h>

#include "core/error.h"
#include "core/log.h"
#include "io/h5.h"
#include "jobs/jobs.h"
#include "model/target_config.h"

namespace aerie::jobs {
namespace {

/// The lines of an INI file as Boost's parser is to read them: a leading UTF-8 byte order mark (Windows
/// editors write one) removed, and `;` comment lines (INI's other comment mark; Boost knows only `#`) made
/// blank, so that line numbers stay those of the file. UsageError when the file cannot be read.
std::string config_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw UsageError("cannot open config file " + path);
  std::ostringstream all;
  all << in.rdbuf();
  std::string text = all.str();
  if (text.rfind("\xEF\xBB\xBF", 0) == 0) text.erase(0, 3);
  std::istringstream lines(text);
  std::string out, line;
  while (std::getline(lines, line)) {
    const size_t a = line.find_first_not_of(" \t");
    if (a != std::string::npos && line[a] == ';') line.clear();
    out += line + "\n";
  }
  return out;
}

/// The INI mistakes Boost's parser takes silently or reports without a line: a value in quotes (kept with
/// its quotes, so `output = "runs/x"` would write to a folder named `"runs`), a key written as an option
/// (`--steps = 5`) and a [section] header (its name would prefix every key). UsageError naming FILE:LINE.
void check_config_lines(const std::string& path) {
  std::istringstream in(config_text(path));
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    const auto trim = [](std::string t) {
      const size_t a = t.find_first_not_of(" \t\r"), b = t.find_last_not_of(" \t\r");
      return a == std::string::npos ? std::string() : t.substr(a, b - a + 1);
    };
    const std::string t = trim(line);
    if (t.empty() || t[0] == '#' || t[0] == ';') continue;
    const std::string where = "config file " + path + ":" + std::to_string(n) + ": ";
    if (t[0] == '[')
      throw UsageError(where + t + ": sections are not used; write the job's options as 'key = value' lines "
                       "without a section header");
    const size_t eq = t.find('=');
    if (eq == std::string::npos)
      throw UsageError(where + "'" + t + "' is not a 'key = value' line (a switch is written 'key = true')");
    const std::string key = trim(t.substr(0, eq)), value = trim(t.substr(eq + 1));
    if (!key.empty() && key[0] == '-')
      throw UsageError(where + "write the key without dashes: '" + key.substr(key.find_first_not_of('-')) +
                       " = " + value + "'");
    if (value.size() >= 2 && (value.front() == '"' || value.front() == '\'') && value.back() == value.front())
      throw UsageError(where + "the value of " + key + " is in quotes, which an INI value keeps as part of it; write '" +
                       key + " = " + value.substr(1, value.size() - 2) + "'");
  }
}

/// "PATH:LINE" of the first 'key = ...' line of the INI file (the key as Boost names it), or "PATH" when
/// none is found.
std::string config_line_of(const std::string& path, std::string key) {
  key.erase(0, key.find_first_not_of('-'));  // Boost may name it as an option ("--steps")
  std::istringstream in(config_text(path));
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    const size_t a = line.find_first_not_of(" \t"), eq = line.find('=');
    if (a == std::string::npos || eq == std::string::npos || eq < a) continue;
    std::string k = line.substr(a, eq - a);
    k.erase(k.find_last_not_of(" \t") + 1);
    if (k == key) return path + ":" + std::to_string(n);
  }
  return path;
}

/// Levenshtein distance of a and b (insertions, deletions, substitutions), for option suggestions.
size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

/// " (did you mean --NAME?)" for the option of `all` closest to the unknown `given` ("--stpes" or, in a
/// config file, "stpes"), when it is within 2 edits, or a third of its length if more; else "".
std::string suggestion(const po::options_description& all, std::string given) {
  while (!given.empty() && given.front() == '-') given.erase(given.begin());
  given = given.substr(0, given.find('='));
  std::vector<std::string> names;
  for (const auto& o : all.options()) names.push_back(o->long_name());
  const std::string best = closest_name(given, names);
  return best.empty() ? "" : " (did you mean --" + best + "?)";
}

}  // namespace

std::string closest_name(const std::string& given, const std::vector<std::string>& names) {
  std::string best;
  size_t best_d = std::max<size_t>(2, given.size() / 3) + 1;  // up to 2 edits, more in long names
  for (const std::string& name : names) {
    const size_t d = edit_distance(given, name);
    if (!name.empty() && d < best_d) best = name, best_d = d;
  }
  return best;
}

bool parse_options(const std::string& job, const std::vector<std::string>& args, po::options_description& desc,
                   po::variables_map& vm) {
  po::options_description common = job_options("Common options");
  common.add_options()("help,h", "show this help")(
      "config", po::value<std::string>(), "INI file with options of this job (command line overrides it)")(
      "log-level", po::value<std::string>()->default_value("info"), "trace, debug, info, warning, error");
  po::options_description all(110, 55);
  all.add(desc).add(common);
  try {
    // No prefix guessing (Boost's default style allows it): "--step 10" would be taken as --steps, and a
    // prefix that an option added later makes ambiguous would break a working command. A mistyped or
    // shortened option is refused with the closest name instead (suggestion()).
    const int style = po::command_line_style::default_style & ~po::command_line_style::allow_guessing;
    const po::parsed_options parsed = po::command_line_parser(args).options(all).style(style).run();
    // No job takes positional arguments, and Boost drops them silently: "--fp8-gemm false" switched the
    // option ON and ignored "false"; a stray word is refused instead.
    for (const po::option& o : parsed.options)
      if (o.position_key >= 0) {
        const std::string word = o.value.empty() ? std::string() : o.value.front();
        throw UsageError("aerie " + job + ": unexpected argument '" + word +
                         "' (options are --name VALUE; a switch such as --fp8-gemm takes no value: leave it out "
                         "to keep it off) (see aerie " + job + " --help)");
      }
    po::store(parsed, vm);
    if (vm.count("config")) {
      std::string path = vm["config"].as<std::string>();
      std::istringstream in;
      try {
        in.str(config_text(path));
        check_config_lines(path);
      } catch (const UsageError& e) {
        throw UsageError("aerie " + job + ": " + e.what());
      }
      try {
        // allow_unregistered = false: a typo in a config file is an error, not a silent default.
        po::store(po::parse_config_file(in, all, false), vm);
      } catch (const po::unknown_option& e) {
        // The suggestion as an INI key ("steps"), not as an option ("--steps").
        std::string hint = suggestion(all, e.get_option_name());
        for (size_t i; (i = hint.find("--")) != std::string::npos;) hint.erase(i, 2);
        throw UsageError("config file " + config_line_of(path, e.get_option_name()) + ": " + e.what() + hint);
      } catch (const po::error_with_option_name& e) {  // a bad value, a repeated key: the line that holds it
        throw UsageError("config file " + config_line_of(path, e.get_option_name()) + ": " + e.what());
      } catch (const po::error& e) {
        throw UsageError("config file " + path + ": " + e.what());
      }
    }
    if (vm.count("help")) {
      int rank = 0;
      MPI_Comm_rank(MPI_COMM_WORLD, &rank);
      if (rank == 0) std::cout << "usage: aerie " << job << " [options]\n" << all << "\n";
      return false;
    }
    po::notify(vm);
  } catch (const po::unknown_option& e) {
    throw UsageError("aerie " + job + ": " + e.what() + suggestion(all, e.get_option_name()) + " (see aerie " + job +
                     " --help)");
  } catch (const po::error& e) {
    throw UsageError("aerie " + job + ": " + e.what() + " (see aerie " + job + " --help)");
  }
  return true;
}

void add_lock_options(po::options_description& desc) {
  desc.add_options()("force-unlock", po::bool_switch()->default_value(false),
                     "take over the output's lock from a job aerie cannot check (recorded on another host); "
                     "only after making sure that job has ended (docs/formats.md, Output locks)");
}

void on_rank0(const std::function<void()>& f) {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  std::string error;
  if (rank == 0) {
    try {
      f();
    } catch (const Error& e) {
      error = e.what();
      if (error.empty()) error = "failed";
    }
  }
  int64_t n = static_cast<int64_t>(error.size());
  MPI_Bcast(&n, 1, MPI_INT64_T, 0, MPI_COMM_WORLD);
  if (n == 0) return;
  error.resize(static_cast<size_t>(n));
  MPI_Bcast(error.data(), static_cast<int>(n), MPI_CHAR, 0, MPI_COMM_WORLD);
  throw CollectiveError(error);
}

TargetFingerprint fingerprint_target(const std::string& dir, int64_t random_seed) {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  std::string text;  // "ok\n" config \n weights \n files \n bytes, or "error\n" message
  if (rank == 0) {
    try {
      const TargetFingerprint f = random_seed >= 0 ? TargetFingerprint::of_random(dir, static_cast<uint64_t>(random_seed))
                                                   : TargetFingerprint::of_model(dir);
      text = "ok\n" + f.config_sha256 + "\n" + f.weights_sha256 + "\n" + std::to_string(f.files) + "\n" +
             std::to_string(f.bytes);
    } catch (const Error& e) {
      text = std::string("error\n") + e.what();
    }
  }
  int64_t n = static_cast<int64_t>(text.size());
  MPI_Bcast(&n, 1, MPI_INT64_T, 0, MPI_COMM_WORLD);
  text.resize(static_cast<size_t>(n));
  MPI_Bcast(text.data(), static_cast<int>(n), MPI_CHAR, 0, MPI_COMM_WORLD);
  std::istringstream in(text);
  std::string status, files, bytes;
  std::getline(in, status);
  if (status != "ok") throw CollectiveError(text.substr(status.size() + 1));
  TargetFingerprint f;
  std::getline(in, f.config_sha256);
  std::getline(in, f.weights_sha256);
  std::getline(in, files);
  std::getline(in, bytes);
  f.files = std::stoll(files);
  f.bytes = std::stoll(bytes);
  return f;
}

OutputLock lock_output(const po::variables_map& vm, const std::string& job, const std::string& target,
                       LockTarget kind) {
  LockOptions o;
  o.force_unlock = vm.count("force-unlock") && vm["force-unlock"].as<bool>();
  return acquire_output_lock(MPI_COMM_WORLD, target, kind, job, o);
}

namespace {

/// What a file holds, from its first bytes, for messages: "an HDF5 file", "a safetensors file", ...
std::string describe_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  char b[64] = {};
  in.read(b, sizeof b);
  const auto n = static_cast<size_t>(in.gcount());
  if (n == 0) return "an empty file";
  if (std::string_view(b, n).substr(0, h5::kSignature.size()) == h5::kSignature) return "an HDF5 file";
  if (n >= 9 && b[8] == '{') {  // safetensors: u64 little-endian header length, then the JSON header
    uint64_t len = 0;
    std::memcpy(&len, b, 8);
    if (len > 1 && len < (uint64_t{1} << 32)) return "a safetensors file";
  }
  size_t i = 0;
  while (i < n && std::isspace(static_cast<unsigned char>(b[i]))) ++i;
  if (i < n && (b[i] == '{' || b[i] == '[')) return "a JSON or JSONL file";
  return "a file of another kind";
}

}  // namespace

void check_output_replaceable(const std::string& job, const std::string& path, const std::string& what,
                              const std::function<bool(const std::string&)>& is_own) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  if (ec && ec != std::errc::no_such_file_or_directory)
    AERIE_THROW(job << ": --output " << path << ": " << ec.message());
  if (!fs::exists(st)) return;
  AERIE_CHECK(!fs::is_directory(st), job << ": --output " << path << " is a folder; name a file (the output is " << what
                                         << ")");
  if (fs::is_regular_file(st) && fs::file_size(path, ec) == 0 && !ec) return;  // nothing to lose
  bool own = false;
  try {
    own = fs::is_regular_file(st) && is_own(path);
  } catch (const std::exception&) {
    own = false;
  }
  AERIE_CHECK(own, job << ": --output " << path << " exists and is not " << what << " (it is " << describe_file(path)
                       << "), so it is not replaced: remove it or choose another --output");
}

std::string follow_output_link(const std::string& job, const std::string& path, bool log) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::path p = path;
  if (!fs::is_symlink(fs::symlink_status(p, ec))) return path;
  for (int hops = 0; fs::is_symlink(fs::symlink_status(p, ec)); ++hops) {
    AERIE_CHECK(hops < 40, job << ": --output " << path << ": more than 40 symbolic links (a loop?)");
    const fs::path target = fs::read_symlink(p, ec);
    AERIE_CHECK(!ec, job << ": --output " << path << ": cannot read the symbolic link " << p.string() << ": "
                         << ec.message());
    p = target.is_absolute() ? target : p.parent_path() / target;
  }
  // The target's folder resolved physically (a `..` after a linked folder is the link target's parent).
  const fs::path dir = p.has_parent_path() ? fs::weakly_canonical(p.parent_path(), ec) : fs::path();
  const std::string resolved = (ec || dir.empty() ? p : dir / p.filename()).string();
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (log && rank == 0) AERIE_LOG(info) << job << ": --output " << path << " is a symbolic link: writing " << resolved;
  return resolved;
}

TargetConfig load_model_option(const std::string& job, const std::string& option, const std::string& dir) {
  try {
    return load_target_config(dir);
  } catch (const Error& e) {
    throw Error(job + ": --" + option + " " + dir + ": " + e.what());  // e.what() ends with its source location
  }
}

po::options_description job_options(const std::string& caption) { return po::options_description(caption, 110, 55); }

std::string trim_blanks(const std::string& text) {
  const size_t b = text.find_first_not_of(" \t"), e = text.find_last_not_of(" \t");
  return b == std::string::npos ? std::string() : text.substr(b, e - b + 1);
}

std::optional<int64_t> parse_int64(const std::string& text) {
  const std::string t = trim_blanks(text);
  if (t.empty()) return std::nullopt;
  int64_t v = 0;
  const char* end = t.data() + t.size();
  const auto r = std::from_chars(t.data(), end, v);
  if (r.ec != std::errc() || r.ptr != end) return std::nullopt;
  return v;
}

std::vector<int> parse_aux_layers(const std::string& s, int64_t num_layers, const std::string& job) {
  if (s.empty()) return default_aux_layers(num_layers);
  std::vector<int> out;
  std::stringstream in(s);
  std::string item;
  while (std::getline(in, item, ',')) {
    const std::optional<int64_t> v = parse_int64(item);
    AERIE_CHECK(v && *v >= INT32_MIN && *v <= INT32_MAX,
                job << ": --aux-layers '" << s << "': '" << item << "' is not an integer");
    out.push_back(static_cast<int>(*v));
  }
  AERIE_CHECK(out.size() == 3, job << ": --aux-layers '" << s << "' must name 3 layers, got " << out.size());
  for (size_t i = 0; i < out.size(); ++i) {
    AERIE_CHECK(out[i] >= 0 && out[i] <= num_layers,
                job << ": --aux-layers " << out[i] << " outside 0.." << num_layers << " (input of decoder layer k)");
    AERIE_CHECK(i == 0 || out[i - 1] <= out[i], job << ": --aux-layers '" << s << "' must be ascending");
  }
  return out;
}


}  // namespace aerie::jobs
