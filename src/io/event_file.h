// TensorBoard event files: what `aerie train` writes beside metrics.jsonl so that `tensorboard --logdir RUN_DIR`
// draws the run's curves (docs/formats.md, TensorBoard event files).
// A file is TFRecord-framed (io/tfrecord.h) serialized Event protocol buffers
// (io/tensorboard/tensorboard_event.proto, the fields of tensorboard/compat/proto/event.proto and
// summary.proto that aerie writes): first an Event with file_version "brain.Event:2", then one Event per
// logged step holding a Summary of scalar values (simple_value, float32) by tag. Its name is
// events.out.tfevents.<unix seconds, 10 digits>.<hostname>, with ".1", ".2", ... appended when a file of
// that name exists (a resumed run started within the same second), so that the names sort in the order
// the files were written. TensorBoard reads every such file of a folder as one run.
// The encoding needs protobuf (Debian's libprotobuf-dev and protobuf-compiler): a build without it has
// event_files_supported() false, and the writer and reader throw.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace aerie {

/// True when aerie was built with protobuf (the event files can be written and read).
bool event_files_supported();

/// Why event files are not supported ("" when they are): names the missing packages.
std::string event_files_unsupported_reason();

/// One Event as read back: wall_time in seconds since the Unix epoch, its step, and either file_version
/// (the first record) or the scalars of a summary (tag, value), in the order they were written.
struct EventRecord {
  double wall_time = 0;
  int64_t step = 0;
  std::string file_version;
  std::vector<std::pair<std::string, float>> scalars;
};

/// Appends Events to a new event file in a folder. Not thread-safe; one writer per file.
class EventFileWriter {
 public:
  /// Creates `dir` if needed and a new file in it (the name above), and writes the file_version Event.
  /// Throws aerie::Error naming the folder or file when it cannot be created or written, or when
  /// !event_files_supported() (with event_files_unsupported_reason()).
  explicit EventFileWriter(const std::string& dir);
  EventFileWriter(const EventFileWriter&) = delete;
  EventFileWriter& operator=(const EventFileWriter&) = delete;

  /// One Event at `step` holding every (tag, value) of `scalars` as a float32 simple_value; wall_time in
  /// seconds since the Unix epoch (< 0: now). Written and flushed at once, so that a killed run leaves
  /// whole records and a running TensorBoard sees the step. Throws aerie::Error naming the file when the
  /// write fails.
  void add_scalars(int64_t step, const std::vector<std::pair<std::string, double>>& scalars, double wall_time = -1);

  /// The file being written.
  const std::string& path() const { return path_; }

 private:
  void append(const std::string& event_bytes);
  std::string path_;
};

/// The events of an event file, in order (CRCs checked). Throws aerie::Error naming the file when it cannot
/// be read, a record is damaged or not an Event, or !event_files_supported(); a torn last record (a writer
/// killed mid-write) is an error unless allow_torn_tail, which drops it.
std::vector<EventRecord> read_event_file(const std::string& path, bool allow_torn_tail = false);

/// The event files of `dir` (names containing "tfevents"), sorted by name (the order they were written);
/// empty when dir does not exist.
std::vector<std::string> list_event_files(const std::string& dir);

/// For a resumed run: rewrites every event file of `dir` that holds an Event of a step > `step` (logged
/// by a killed run after its last checkpoint) or a torn last record, keeping the file_version Event and the
/// Events of steps <= `step`, so that the curves continue without a doubled stretch. Each rewrite is
/// atomic (a .tmp file renamed over it). Returns the number of Events dropped. Throws aerie::Error naming the
/// file when it cannot be read or replaced; does nothing when !event_files_supported().
int64_t truncate_event_files(const std::string& dir, int64_t step);

}  // namespace aerie
