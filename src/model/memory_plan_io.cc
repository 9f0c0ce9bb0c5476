// The inputs of a memory plan (memory_plan.h): config.json, the tensor list of a checkpoint's safetensors
// headers (checked as the loader checks them; the data is never read), a name/shape/dtype list
// (.jsonl, gzip or plain), and memory sizes such as "96GB".
#include <zlib.h>

#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include "core/error.h"
#include "io/safetensors.h"
#include "model/memory_plan.h"

namespace aerie {

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// One entry of a tensor list (--tensors) -> TensorInfo; `where` names the file and line for messages.
TensorInfo tensor_of(const std::string& name, const json& v, const std::string& where) {
  AERIE_CHECK(v.is_object() && v.contains("dtype") && v["dtype"].is_string() && v.contains("shape") &&
                  v["shape"].is_array(),
              where << ": tensor '" << name << "' needs a dtype string and a shape array: " << v.dump());
  TensorInfo t{name, v["dtype"].get<std::string>(), {}};
  AERIE_CHECK(safetensors_dtype_bytes(t.dtype) > 0, where << ": tensor '" << name << "' has unknown dtype '"
                                                          << t.dtype << "'");
  uint64_t numel = 1;  // bytes as the safetensors reader bounds them (2^62): a wider shape would wrap the sums
  for (const json& d : v["shape"]) {
    AERIE_CHECK(d.is_number_unsigned(), where << ": tensor '" << name << "': bad dimension " << d.dump());
    const uint64_t n = d.get<uint64_t>();
    AERIE_CHECK(n == 0 || numel <= (uint64_t{1} << 62) / n / static_cast<uint64_t>(safetensors_dtype_bytes(t.dtype)),
                where << ": tensor '" << name << "': shape " << v["shape"].dump() << " overflows (more than 2^62 bytes)");
    numel *= n;
    t.shape.push_back(static_cast<int64_t>(n));
  }
  return t;
}

// The tensors of one safetensors file's header, checked as the loader checks it (io/safetensors.h's
// SafetensorsReader: dtypes it reads, data_offsets inside the data buffer, a file as long as the header says),
// so that the plan refuses what extract would refuse, naming the file and the tensor. The data is not read.
std::vector<TensorInfo> header_tensors(const std::string& path) {
  const SafetensorsReader reader(path);
  std::vector<TensorInfo> out;
  for (const auto& [name, e] : reader.entries())
    out.push_back({name, dtype_name(e.dtype), e.shape});
  return out;
}

}  // namespace

json read_model_config(const std::string& path) {
  const fs::path p = fs::is_directory(path) ? fs::path(path) / "config.json" : fs::path(path);
  std::ifstream in(p);
  AERIE_CHECK(in, "cannot open model config " << p.string() << ": " << std::strerror(errno));
  json j;
  try {
    j = json::parse(in);
  } catch (const json::exception& e) {
    AERIE_THROW(p.string() << ": bad JSON: " << e.what());
  }
  AERIE_CHECK(j.is_object(), p.string() << ": not a JSON object");
  return j;
}

std::vector<TensorInfo> read_checkpoint_tensors(const std::string& dir) {
  const fs::path single = fs::path(dir) / "model.safetensors";
  const fs::path index = fs::path(dir) / "model.safetensors.index.json";
  if (fs::exists(single)) return header_tensors(single.string());
  AERIE_CHECK(fs::exists(index), "no model.safetensors or model.safetensors.index.json in " << dir);
  const json j = read_model_config(index.string());
  AERIE_CHECK(j.contains("weight_map") && j["weight_map"].is_object(), index.string() << ": no weight_map object");
  std::map<std::string, std::set<std::string>> names_of;  // shard -> the tensors the index puts there
  for (const auto& [name, file] : j["weight_map"].items()) {
    AERIE_CHECK(file.is_string(), index.string() << ": weight_map[\"" << name << "\"] is not a file name");
    names_of[file.get<std::string>()].insert(name);
  }
  std::vector<TensorInfo> out;
  for (const auto& [file, names] : names_of) {
    const fs::path p = fs::path(dir) / file;
    AERIE_CHECK(fs::exists(p), index.string() << " names shard " << file << " (for \"" << *names.begin()
                                              << "\"), which does not exist in " << dir);
    std::vector<TensorInfo> shard = header_tensors(p.string());
    std::set<std::string> found;
    for (const TensorInfo& t : shard) found.insert(t.name);
    for (const std::string& n : names)
      AERIE_CHECK(found.count(n), index.string() << " puts tensor \"" << n << "\" in " << p.string()
                                                 << ", whose header has no such tensor");
    out.insert(out.end(), std::make_move_iterator(shard.begin()), std::make_move_iterator(shard.end()));
  }
  return out;
}

std::vector<TensorInfo> read_tensor_list(const std::string& path) {
  gzFile f = gzopen(path.c_str(), "rb");  // reads plain files as they are
  AERIE_CHECK(f, "cannot open tensor list " << path << ": " << std::strerror(errno));
  std::vector<TensorInfo> out;
  std::string line;
  char buf[4096];
  int64_t lineno = 0;
  try {
    while (gzgets(f, buf, sizeof buf)) {
      line += buf;
      if (line.back() != '\n' && !gzeof(f)) continue;  // a line longer than the buffer
      ++lineno;
      while (!line.empty() && std::isspace(static_cast<unsigned char>(line.back()))) line.pop_back();
      if (!line.empty()) {
        const std::string where = path + ":" + std::to_string(lineno);
        json j;
        try {
          j = json::parse(line);
        } catch (const json::exception& e) {
          AERIE_THROW(where << ": not a JSON object: " << e.what());
        }
        AERIE_CHECK(j.is_object() && j.contains("name") && j["name"].is_string(), where << ": no \"name\" string");
        out.push_back(tensor_of(j["name"].get<std::string>(), j, where));
      }
      line.clear();
    }
    int err = Z_OK;
    const char* msg = gzerror(f, &err);
    AERIE_CHECK(err == Z_OK || err == Z_STREAM_END, path << ": read error after line " << lineno << ": " << msg);
  } catch (...) {
    gzclose(f);
    throw;
  }
  gzclose(f);
  AERIE_CHECK(!out.empty(), path << ": no tensors");
  return out;
}

int64_t parse_memory_size(const std::string& s) {
  size_t pos = 0;
  double v = 0;
  try {
    v = std::stod(s, &pos);
  } catch (const std::exception&) {
    AERIE_THROW("memory size '" << s << "' does not start with a number (e.g. 96GB, 80GiB)");
  }
  std::string unit;
  for (char c : s.substr(pos))
    if (!std::isspace(static_cast<unsigned char>(c))) unit += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  static const std::map<std::string, double> units = {
      {"", 1},         {"b", 1},          {"kb", 1e3},       {"mb", 1e6},          {"gb", 1e9},
      {"tb", 1e12},    {"kib", 1024.0},   {"mib", 1048576.0}, {"gib", 1073741824.0}, {"tib", 1099511627776.0}};
  auto it = units.find(unit);
  AERIE_CHECK(it != units.end(), "memory size '" << s << "': unknown unit (B, KB, MB, GB, TB, KiB, MiB, GiB, TiB)");
  AERIE_CHECK(std::isfinite(v) && v >= 0 && v * it->second < 9.2e18, "memory size '" << s << "' is out of range");
  return static_cast<int64_t>(std::llround(v * it->second));
}

}  // namespace aerie
