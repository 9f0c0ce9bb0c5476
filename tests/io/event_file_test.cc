// TensorBoard event files (io/event_file.h): a file written for a few steps read back record by record
// (framing and CRCs by read_tfrecords, then the Events: file_version first, tags, steps and values as
// written), the file name, a second writer in the same folder, truncation for a resumed run, and a folder
// that cannot be made. Skipped, with the reason, in a build without protobuf. tests/mpi/tensorboard.cmake
// reads a train run's files with TensorBoard itself.
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "io/event_file.h"
#include "io/tfrecord.h"
#include "test_util.h"

namespace aerie {
namespace {

namespace fs = std::filesystem;
using testing::error_of;

#define REQUIRE_EVENT_FILES()                                               \
  do {                                                                      \
    if (!event_files_supported()) GTEST_SKIP() << event_files_unsupported_reason(); \
  } while (0)

TEST(EventFile, WritesScalarsThatReadBack) {
  REQUIRE_EVENT_FILES();
  const std::string dir = testing::scratch_dir("event_file") + "/run";
  std::string path;
  {
    EventFileWriter w(dir);  // creates the folder
    path = w.path();
    for (int64_t step = 10; step <= 30; step += 10)
      w.add_scalars(step, {{"train/loss", 1.0 / step}, {"train/lr", 3e-3}, {"train/acc_k/0", 0.25 * step / 10}},
                    1700000000.5 + step);
  }
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  const std::string name = fs::path(path).filename().string();
  EXPECT_EQ(fs::path(path).parent_path().string(), dir);
  EXPECT_EQ(name.rfind("events.out.tfevents.", 0), 0u) << name;
  EXPECT_EQ(name.size(), std::string("events.out.tfevents.").size() + 10 + 1 + std::string(host).size()) << name;
  EXPECT_TRUE(name.ends_with(std::string(".").append(host))) << name;

  // Framing and CRCs: every record whole and checked.
  const TFRecords raw = read_tfrecords(path);
  EXPECT_EQ(raw.records.size(), 4u);
  EXPECT_EQ(raw.torn_tail_bytes, 0);

  const std::vector<EventRecord> ev = read_event_file(path);
  ASSERT_EQ(ev.size(), 4u);
  EXPECT_EQ(ev[0].file_version, "brain.Event:2");
  EXPECT_TRUE(ev[0].scalars.empty());
  EXPECT_GT(ev[0].wall_time, 1.6e9);
  for (int i = 1; i <= 3; ++i) {
    const int64_t step = 10 * i;
    EXPECT_EQ(ev[i].step, step);
    EXPECT_EQ(ev[i].file_version, "");
    EXPECT_DOUBLE_EQ(ev[i].wall_time, 1700000000.5 + step);
    ASSERT_EQ(ev[i].scalars.size(), 3u);
    EXPECT_EQ(ev[i].scalars[0].first, "train/loss");
    EXPECT_EQ(ev[i].scalars[0].second, static_cast<float>(1.0 / step));
    EXPECT_EQ(ev[i].scalars[1].first, "train/lr");
    EXPECT_EQ(ev[i].scalars[1].second, 3e-3f);
    EXPECT_EQ(ev[i].scalars[2].first, "train/acc_k/0");
    EXPECT_EQ(ev[i].scalars[2].second, static_cast<float>(0.25 * step / 10));
  }
  EXPECT_EQ(list_event_files(dir), std::vector<std::string>{path});
}

TEST(EventFile, ASecondWriterGetsANewFileThatSortsAfterTheFirst) {
  REQUIRE_EVENT_FILES();
  const std::string dir = testing::scratch_dir("event_file_two");
  EventFileWriter a(dir);
  a.add_scalars(1, {{"x", 1}});
  EventFileWriter b(dir);  // most likely the same second: the name gets ".1"
  b.add_scalars(2, {{"x", 2}});
  EXPECT_NE(a.path(), b.path());
  EXPECT_EQ(list_event_files(dir), (std::vector<std::string>{a.path(), b.path()}));
  EXPECT_EQ(read_event_file(a.path()).size(), 2u);
  EXPECT_EQ(read_event_file(b.path()).back().step, 2);
}

TEST(EventFile, TruncatesStepsPastACheckpointAndATornTail) {
  REQUIRE_EVENT_FILES();
  const std::string dir = testing::scratch_dir("event_file_truncate");
  std::string path;
  {
    EventFileWriter w(dir);
    path = w.path();
    for (int64_t step = 2; step <= 8; step += 2) w.add_scalars(step, {{"train/loss", static_cast<double>(step)}});
  }
  std::ofstream(path, std::ios::binary | std::ios::app) << tfrecord_frame("torn").substr(0, 9);  // a killed write
  EXPECT_NE(error_of([&] { read_event_file(path); }).find("the file ends inside the record"), std::string::npos);
  EXPECT_EQ(read_event_file(path, true).size(), 5u);

  EXPECT_EQ(truncate_event_files(dir, 4), 2);  // steps 6 and 8 go, and the torn tail
  const std::vector<EventRecord> ev = read_event_file(path);
  ASSERT_EQ(ev.size(), 3u);
  EXPECT_EQ(ev[0].file_version, "brain.Event:2");
  EXPECT_EQ(ev[1].step, 2);
  EXPECT_EQ(ev[2].step, 4);
  EXPECT_EQ(truncate_event_files(dir, 4), 0);  // nothing left to drop: the file is not rewritten
  EXPECT_EQ(list_event_files(dir), std::vector<std::string>{path});  // no .tmp left
  EXPECT_EQ(truncate_event_files(dir + "/none", 4), 0);
}

TEST(EventFile, AFolderThatCannotBeMadeIsNamed) {
  REQUIRE_EVENT_FILES();
  const std::string dir = testing::scratch_dir("event_file_bad");
  std::ofstream(dir + "/file") << "not a folder";
  const std::string e = error_of([&] { EventFileWriter w(dir + "/file/tb"); });
  EXPECT_NE(e.find("cannot create the TensorBoard folder " + dir + "/file/tb"), std::string::npos) << e;
  const std::string r = error_of([&] { read_event_file(dir + "/file"); });
  EXPECT_NE(r.find(dir + "/file"), std::string::npos) << r;
}

TEST(EventFile, WithoutProtobufTheReasonIsGiven) {
  if (event_files_supported()) {
    EXPECT_EQ(event_files_unsupported_reason(), "");
    return;
  }
  EXPECT_NE(event_files_unsupported_reason().find("libprotobuf-dev"), std::string::npos);
  EXPECT_NE(error_of([] { EventFileWriter w("/tmp"); }).find("protobuf"), std::string::npos);
}

}  // namespace
}  // namespace aerie
