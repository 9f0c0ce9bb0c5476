// TFRecord framing (io/tfrecord.h): CRC-32C against its published check values, the record layout, and
// damaged or torn files refused naming the file and the offset.
#include <filesystem>
#include <fstream>

#include "io/tfrecord.h"
#include "test_util.h"

namespace aerie {
namespace {

using testing::error_of;

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

uint32_t le32(const std::string& s, size_t at) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(static_cast<unsigned char>(s[at + i])) << (8 * i);
  return v;
}

TEST(Crc32c, MatchesThePublishedCheckValues) {
  // The CRC catalogue's check value of CRC-32/ISCSI, and RFC 3720 (iSCSI), appendix B.4.
  EXPECT_EQ(crc32c("123456789", 9), 0xE3069283u);
  const std::string zeros(32, '\0'), ones(32, '\xff');
  std::string ascending(32, '\0');
  for (int i = 0; i < 32; ++i) ascending[i] = static_cast<char>(i);
  EXPECT_EQ(crc32c(zeros.data(), zeros.size()), 0x8A9136AAu);
  EXPECT_EQ(crc32c(ones.data(), ones.size()), 0x62A8AB43u);
  EXPECT_EQ(crc32c(ascending.data(), ascending.size()), 0x46DD794Eu);
  // The mask of tensorflow/core/lib/hash/crc32c.h: rotate right by 15, add 0xa282ead8.
  const uint32_t c = 0xE3069283u;
  EXPECT_EQ(masked_crc32c("123456789", 9), ((c >> 15) | (c << 17)) + 0xa282ead8u);
}

TEST(TFRecord, FramesAndReadsBack) {
  const std::string dir = testing::scratch_dir("tfrecord");
  const std::string a = "brain.Event:2", b(300, 'x');
  const std::string ra = tfrecord_frame(a);
  ASSERT_EQ(ra.size(), a.size() + 16);
  EXPECT_EQ(static_cast<unsigned char>(ra[0]), a.size());
  for (int i = 1; i < 8; ++i) EXPECT_EQ(ra[i], '\0');
  EXPECT_EQ(le32(ra, 8), masked_crc32c(ra.data(), 8));
  EXPECT_EQ(ra.substr(12, a.size()), a);
  EXPECT_EQ(le32(ra, 12 + a.size()), masked_crc32c(a.data(), a.size()));

  const std::string path = dir + "/records";
  write_bytes(path, ra + tfrecord_frame(b) + tfrecord_frame(""));
  TFRecords got = read_tfrecords(path);
  ASSERT_EQ(got.records.size(), 3u);
  EXPECT_EQ(got.records[0], a);
  EXPECT_EQ(got.records[1], b);
  EXPECT_EQ(got.records[2], "");
  EXPECT_EQ(got.torn_tail_bytes, 0);
}

TEST(TFRecord, RefusesDamagedAndTornFiles) {
  const std::string dir = testing::scratch_dir("tfrecord_bad");
  const std::string one = tfrecord_frame("first"), two = tfrecord_frame("second record");
  std::string flipped = one + two;
  flipped[one.size() + 14] ^= 0x01;  // a byte of the second record's data
  write_bytes(dir + "/flipped", flipped);
  std::string e = error_of([&] { read_tfrecords(dir + "/flipped"); });
  EXPECT_NE(e.find(dir + "/flipped: the data CRC of the record at byte " + std::to_string(one.size())),
            std::string::npos)
      << e;
  std::string length = one;
  length[0] = 'X';
  write_bytes(dir + "/length", length);
  e = error_of([&] { read_tfrecords(dir + "/length"); });
  EXPECT_NE(e.find("the length CRC of the record at byte 0"), std::string::npos) << e;

  const std::string torn = one + two.substr(0, 20);
  write_bytes(dir + "/torn", torn);
  e = error_of([&] { read_tfrecords(dir + "/torn"); });
  EXPECT_NE(e.find(dir + "/torn: the file ends inside the record at byte " + std::to_string(one.size())),
            std::string::npos)
      << e;
  TFRecords got = read_tfrecords(dir + "/torn", true);
  ASSERT_EQ(got.records.size(), 1u);
  EXPECT_EQ(got.records[0], "first");
  EXPECT_EQ(got.torn_tail_bytes, 20);

  e = error_of([&] { read_tfrecords(dir + "/missing"); });
  EXPECT_NE(e.find("cannot read TFRecord file " + dir + "/missing"), std::string::npos) << e;
}

}  // namespace
}  // namespace aerie
