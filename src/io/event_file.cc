// TensorBoard event files (io/event_file.h): naming, appending, reading back, truncating on resume.
#include "io/event_file.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "io/tensorboard/event_codec.h"
#include "io/tfrecord.h"

namespace aerie {

namespace fs = std::filesystem;

namespace {

constexpr const char* kFileVersion = "brain.Event:2";

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string host_name() {
  char buf[256] = {};
  if (gethostname(buf, sizeof buf - 1) != 0 || buf[0] == '\0') return "localhost";
  return buf;
}

// A new file name in dir: events.out.tfevents.<10-digit seconds>.<host>[.N].
std::string new_event_file(const std::string& dir) {
  char secs[32];
  std::snprintf(secs, sizeof secs, "%010lld", static_cast<long long>(now_seconds()));
  const std::string base = (fs::path(dir) / ("events.out.tfevents." + std::string(secs) + "." + host_name())).string();
  std::string path = base;
  for (int n = 1; fs::exists(path); ++n) path = base + "." + std::to_string(n);
  return path;
}

void write_records(const std::string& path, const std::vector<std::string>& records) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    AERIE_CHECK(out, "cannot write " << tmp << ": " << std::strerror(errno));
    for (const std::string& r : records) out << tfrecord_frame(r);
    out.flush();
    AERIE_CHECK(out.good(), "cannot write " << tmp << ": " << std::strerror(errno));
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  AERIE_CHECK(!ec, "cannot replace " << path << " by " << tmp << ": " << ec.message());
}

}  // namespace

bool event_files_supported() { return tensorboard::codec_available(); }

std::string event_files_unsupported_reason() {
  if (event_files_supported()) return "";
  return "aerie was built without protobuf, so it writes no TensorBoard event files (install libprotobuf-dev and "
         "protobuf-compiler, e.g. with tools/setup, and rebuild)";
}

EventFileWriter::EventFileWriter(const std::string& dir) {
  AERIE_CHECK(event_files_supported(), event_files_unsupported_reason());
  std::error_code ec;
  fs::create_directories(dir, ec);
  AERIE_CHECK(!ec, "cannot create the TensorBoard folder " << dir << ": " << ec.message());
  path_ = new_event_file(dir);
  {
    std::ofstream out(path_, std::ios::binary | std::ios::app);
    AERIE_CHECK(out, "cannot create the TensorBoard event file " << path_ << ": " << std::strerror(errno));
  }
  EventRecord first;
  first.wall_time = now_seconds();
  first.file_version = kFileVersion;
  append(tensorboard::encode_event(first));
}

void EventFileWriter::add_scalars(int64_t step, const std::vector<std::pair<std::string, double>>& scalars,
                                  double wall_time) {
  EventRecord e;
  e.wall_time = wall_time < 0 ? now_seconds() : wall_time;
  e.step = step;
  for (const auto& [tag, value] : scalars) e.scalars.emplace_back(tag, static_cast<float>(value));
  append(tensorboard::encode_event(e));
}

void EventFileWriter::append(const std::string& event_bytes) {
  // Opened per record (a log interval apart): the file is always whole on disk and needs no close.
  std::ofstream out(path_, std::ios::binary | std::ios::app);
  AERIE_CHECK(out, "cannot append to the TensorBoard event file " << path_ << ": " << std::strerror(errno));
  out << tfrecord_frame(event_bytes);
  out.flush();
  AERIE_CHECK(out.good(), "cannot append to the TensorBoard event file " << path_ << ": " << std::strerror(errno));
}

std::vector<EventRecord> read_event_file(const std::string& path, bool allow_torn_tail) {
  AERIE_CHECK(event_files_supported(), path << ": " << event_files_unsupported_reason());
  const TFRecords file = read_tfrecords(path, allow_torn_tail);
  std::vector<EventRecord> out(file.records.size());
  for (size_t i = 0; i < file.records.size(); ++i)
    AERIE_CHECK(tensorboard::decode_event(file.records[i], out[i]),
                path << ": record " << i << " is not a TensorBoard Event protocol buffer");
  return out;
}

std::vector<std::string> list_event_files(const std::string& dir) {
  std::vector<std::string> out;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return out;
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    if (e.is_regular_file() && name.find("tfevents") != std::string::npos && !name.ends_with(".tmp"))
      out.push_back(e.path().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

int64_t truncate_event_files(const std::string& dir, int64_t step) {
  if (!event_files_supported()) return 0;
  int64_t dropped = 0;
  for (const std::string& path : list_event_files(dir)) {
    const TFRecords file = read_tfrecords(path, true);
    std::vector<std::string> kept;
    for (size_t i = 0; i < file.records.size(); ++i) {
      EventRecord e;
      AERIE_CHECK(tensorboard::decode_event(file.records[i], e),
                  path << ": record " << i << " is not a TensorBoard Event protocol buffer");
      if (e.file_version.empty() && e.step > step)
        ++dropped;
      else
        kept.push_back(file.records[i]);
    }
    if (kept.size() < file.records.size() || file.torn_tail_bytes > 0) write_records(path, kept);
  }
  return dropped;
}

}  // namespace aerie
