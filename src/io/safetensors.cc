// safetensors reader/writer. Format (https://github.com/huggingface/safetensors README): u64 LE header
// size N, N bytes of UTF-8 JSON {name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__":
// {str: str}} (padded with spaces), then the data buffer; offsets are relative to the buffer start.
#include "io/safetensors.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <set>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace aerie {

namespace {

// The reference implementation refuses headers above 100 MB; so do we (a corrupt size field would
// otherwise make us allocate garbage).
constexpr uint64_t kMaxHeader = 100u << 20;

uint64_t read_u64_le(const unsigned char* b) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | b[i];
  return v;
}

// Returns the dtype of a safetensors dtype string; throws for dtypes aerie does not hold.
DType parse_dtype(const std::string& s, const std::string& path, const std::string& name) {
  if (s == "F32") return DType::F32;
  if (s == "BF16") return DType::BF16;
  if (s == "F16") return DType::F16;
  if (s == "I32") return DType::I32;
  if (s == "I64") return DType::I64;
  if (s == "U8" || s == "BOOL") return DType::U8;
  if (s == "F8_E4M3") return DType::F8E4M3;
  AERIE_THROW(path << ": tensor '" << name << "' has dtype " << s
                   << ", not supported (F32, BF16, F16, I32, I64, U8, BOOL, F8_E4M3)");
}

void write_all(int fd, const void* data, size_t n, const std::string& path) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::write(fd, p, std::min<size_t>(n, size_t{1} << 30));
    if (w < 0 && errno == EINTR) continue;
    AERIE_CHECK(w > 0, "writing " << path << ": " << std::strerror(errno));
    p += w;
    n -= static_cast<size_t>(w);
  }
}

}  // namespace

SafetensorsReader::SafetensorsReader(const std::string& path) : path_(path) {
  AERIE_CHECK(!std::filesystem::is_directory(path), path << ": a folder, not a safetensors file");
  std::ifstream f(path, std::ios::binary);
  AERIE_CHECK(f, "cannot open safetensors file " << path << ": " << std::strerror(errno));
  f.seekg(0, std::ios::end);
  const auto file_size = static_cast<uint64_t>(f.tellg());
  f.seekg(0);
  AERIE_CHECK(file_size >= 8, path << ": truncated safetensors file (" << file_size << " bytes, no header size)");
  unsigned char b8[8];
  f.read(reinterpret_cast<char*>(b8), 8);
  AERIE_CHECK(f, path << ": read error in the header size");
  const uint64_t header_len = read_u64_le(b8);
  AERIE_CHECK(header_len <= kMaxHeader, path << ": header size " << header_len << " exceeds the 100 MB limit");
  AERIE_CHECK(8 + header_len <= file_size, path << ": truncated safetensors file: header of " << header_len
                                                << " bytes but the file has " << file_size);
  std::string header(header_len, '\0');
  f.read(header.data(), static_cast<std::streamsize>(header_len));
  AERIE_CHECK(f, path << ": read error in the header");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(header);
  } catch (const nlohmann::json::exception& e) {
    AERIE_THROW(path << ": bad JSON header: " << e.what());
  }
  AERIE_CHECK(j.is_object(), path << ": the header is not a JSON object");
  const uint64_t data_size = file_size - 8 - header_len;
  const uint64_t data_start = 8 + header_len;

  for (const auto& [name, v] : j.items()) {
    if (name == "__metadata__") {
      if (v.is_null()) continue;
      AERIE_CHECK(v.is_object(), path << ": __metadata__ is not an object");
      for (const auto& [k, s] : v.items()) {
        AERIE_CHECK(s.is_string(), path << ": __metadata__ value of '" << k << "' is not a string");
        metadata_[k] = s.get<std::string>();
      }
      continue;
    }
    AERIE_CHECK(v.is_object() && v.contains("dtype") && v["dtype"].is_string() && v.contains("shape") &&
                    v["shape"].is_array() && v.contains("data_offsets") && v["data_offsets"].is_array() &&
                    v["data_offsets"].size() == 2,
                path << ": tensor '" << name << "': entry needs dtype, shape and data_offsets: " << v.dump());
    SafetensorsEntry e;
    e.dtype = parse_dtype(v["dtype"].get<std::string>(), path, name);
    uint64_t numel = 1;
    for (const auto& d : v["shape"]) {
      AERIE_CHECK(d.is_number_unsigned(), path << ": tensor '" << name << "': bad dimension " << d.dump());
      const uint64_t n = d.get<uint64_t>();
      // Bytes, not elements, bounded: numel x dtype_size must not wrap (a [2^31, 2^31] F32 tensor is 2^64 bytes).
      AERIE_CHECK(n == 0 || numel <= (uint64_t{1} << 62) / n / dtype_size(e.dtype),
                  path << ": tensor '" << name << "': shape overflows (more than 2^62 bytes)");
      numel *= n;
      e.shape.push_back(static_cast<int64_t>(n));
    }
    const auto& offs = v["data_offsets"];
    AERIE_CHECK(offs[0].is_number_unsigned() && offs[1].is_number_unsigned(),
                path << ": tensor '" << name << "': data_offsets are not non-negative integers");
    const uint64_t begin = offs[0].get<uint64_t>(), end = offs[1].get<uint64_t>();
    e.nbytes = numel * dtype_size(e.dtype);
    AERIE_CHECK(begin <= end && end <= data_size,
                path << ": tensor '" << name << "': data_offsets [" << begin << ", " << end
                     << ") outside the data buffer of " << data_size << " bytes (truncated file?)");
    AERIE_CHECK(end - begin == e.nbytes, path << ": tensor '" << name << "': data_offsets span " << end - begin
                                              << " bytes, but " << v["dtype"].get<std::string>() << " "
                                              << shape_str(e.shape) << " needs " << e.nbytes);
    e.offset = data_start + begin;
    entries_.emplace(name, std::move(e));
  }
}

SafetensorsReader SafetensorsReader::listing(const std::string& label, std::map<std::string, SafetensorsEntry> entries) {
  SafetensorsReader r;
  r.path_ = label;
  r.listing_ = true;
  r.entries_ = std::move(entries);
  return r;
}

void SafetensorsReader::check_data(const std::string& name) const {
  AERIE_CHECK(!listing_, path_ << ": tensor '" << name << "': a tensor list holds no data to read");
}

Tensor SafetensorsReader::read(const std::string& name) const {
  auto it = entries_.find(name);
  AERIE_CHECK(it != entries_.end(), path_ << ": no tensor '" << name << "'");
  check_data(name);
  if (it->second.shape.empty()) {  // a scalar: no dim 0 to slice
    Tensor t = Tensor::empty({}, it->second.dtype);
    std::ifstream f(path_, std::ios::binary);
    f.seekg(static_cast<std::streamoff>(it->second.offset));
    f.read(static_cast<char*>(t.raw()), static_cast<std::streamsize>(it->second.nbytes));
    AERIE_CHECK(f, path_ << ": tensor '" << name << "': read error");
    return t;
  }
  return read_rows(name, 0, it->second.shape[0]);
}

Tensor SafetensorsReader::read_rows(const std::string& name, int64_t begin, int64_t end) const {
  auto it = entries_.find(name);
  AERIE_CHECK(it != entries_.end(), path_ << ": no tensor '" << name << "'");
  const SafetensorsEntry& e = it->second;
  AERIE_CHECK(!e.shape.empty() && 0 <= begin && begin <= end && end <= e.shape[0],
              path_ << ": tensor '" << name << "' " << shape_str(e.shape) << ": rows [" << begin << ", " << end
                    << ") out of range");
  check_data(name);
  Shape shape = e.shape;
  shape[0] = end - begin;
  Tensor t = Tensor::empty(shape, e.dtype);
  const uint64_t row_bytes = e.shape[0] ? e.nbytes / static_cast<uint64_t>(e.shape[0]) : 0;
  if (t.nbytes() > 0) {
    std::ifstream f(path_, std::ios::binary);
    AERIE_CHECK(f, "cannot open safetensors file " << path_ << ": " << std::strerror(errno));
    f.seekg(static_cast<std::streamoff>(e.offset + static_cast<uint64_t>(begin) * row_bytes));
    f.read(static_cast<char*>(t.raw()), static_cast<std::streamsize>(t.nbytes()));
    AERIE_CHECK(f, path_ << ": tensor '" << name << "': read error");
  }
  return t;
}

Tensor SafetensorsReader::read_cols(const std::string& name, int64_t begin, int64_t end) const {
  auto it = entries_.find(name);
  AERIE_CHECK(it != entries_.end(), path_ << ": no tensor '" << name << "'");
  const SafetensorsEntry& e = it->second;
  AERIE_CHECK(e.shape.size() == 2 && 0 <= begin && begin <= end && end <= e.shape[1],
              path_ << ": tensor '" << name << "' " << shape_str(e.shape) << ": columns [" << begin << ", " << end
                    << ") of a 2-D tensor out of range");
  check_data(name);
  const int64_t R = e.shape[0], C = e.shape[1];
  Tensor t = Tensor::empty({R, end - begin}, e.dtype);
  if (t.nbytes() == 0) return t;
  const uint64_t elem = dtype_size(e.dtype), row_bytes = static_cast<uint64_t>(C) * elem;
  const uint64_t part = static_cast<uint64_t>(end - begin) * elem;
  std::ifstream f(path_, std::ios::binary);
  AERIE_CHECK(f, "cannot open safetensors file " << path_ << ": " << std::strerror(errno));
  char* dst = static_cast<char*>(t.raw());
  for (int64_t i = 0; i < R; ++i) {
    f.seekg(static_cast<std::streamoff>(e.offset + static_cast<uint64_t>(i) * row_bytes +
                                        static_cast<uint64_t>(begin) * elem));
    f.read(dst + static_cast<uint64_t>(i) * part, static_cast<std::streamsize>(part));
    AERIE_CHECK(f, path_ << ": tensor '" << name << "': read error at row " << i);
  }
  return t;
}

SafetensorsFile load_safetensors(const std::string& path) {
  SafetensorsReader r(path);
  SafetensorsFile out;
  out.metadata = r.metadata();
  for (const auto& [name, e] : r.entries()) out.tensors.emplace(name, r.read(name));
  return out;
}

void save_safetensors(const std::string& path, const SafetensorsFile& file,
                      const std::vector<std::string>& bool_tensors, const std::string& tmp_path) {
  const std::set<std::string> bools(bool_tensors.begin(), bool_tensors.end());
  for (const auto& b : bools) {
    auto it = file.tensors.find(b);
    AERIE_CHECK(it != file.tensors.end(), path << ": BOOL tensor '" << b << "' is not in the file");
    AERIE_CHECK(it->second.dtype() == DType::U8, path << ": BOOL tensor '" << b << "' must hold U8 data, not "
                                                       << dtype_name(it->second.dtype()));
  }
  nlohmann::json j = nlohmann::json::object();
  if (!file.metadata.empty()) j["__metadata__"] = file.metadata;
  uint64_t off = 0;
  for (const auto& [name, t] : file.tensors) {
    AERIE_CHECK(name != "__metadata__", path << ": a tensor cannot be named __metadata__");
    AERIE_CHECK(t.device() == Device::CPU, path << ": tensor '" << name << "' is not on the CPU");
    nlohmann::json e;
    e["dtype"] = bools.count(name) ? "BOOL" : dtype_name(t.dtype());
    e["shape"] = t.shape();
    e["data_offsets"] = {off, off + t.nbytes()};
    off += t.nbytes();
    j[name] = std::move(e);
  }
  std::string header = j.dump();
  header.append((8 - header.size() % 8) % 8, ' ');  // data buffer 8-byte aligned, as the reference writer
  unsigned char b8[8];
  for (int i = 0; i < 8; ++i) b8[i] = static_cast<unsigned char>((uint64_t{header.size()} >> (8 * i)) & 0xFF);

  const std::string tmp = tmp_path.empty() ? path + ".tmp" : tmp_path;
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  AERIE_CHECK(fd >= 0, "cannot create " << tmp << ": " << std::strerror(errno));
  try {
    write_all(fd, b8, 8, tmp);
    write_all(fd, header.data(), header.size(), tmp);
    for (const auto& [name, t] : file.tensors) write_all(fd, t.raw(), t.nbytes(), tmp);
    AERIE_CHECK(::fsync(fd) == 0, "fsync " << tmp << ": " << std::strerror(errno));
  } catch (...) {
    ::close(fd);
    ::unlink(tmp.c_str());
    throw;
  }
  AERIE_CHECK(::close(fd) == 0, "closing " << tmp << ": " << std::strerror(errno));
  AERIE_CHECK(::rename(tmp.c_str(), path.c_str()) == 0,
              "renaming " << tmp << " to " << path << ": " << std::strerror(errno));
  // Make the rename itself durable.
  std::filesystem::path dir = std::filesystem::path(path).parent_path();
  if (dir.empty()) dir = std::filesystem::path(".");
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

}  // namespace aerie
