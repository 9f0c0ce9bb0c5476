// TFRecord framing (io/tfrecord.h) with Boost.CRC's CRC-32C.
#include "io/tfrecord.h"

#include <boost/crc.hpp>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <iterator>

#include "core/error.h"

namespace aerie {

namespace {

void put_le(std::string& out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
}

uint64_t get_le(const char* p, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v |= static_cast<uint64_t>(static_cast<unsigned char>(p[i])) << (8 * i);
  return v;
}

}  // namespace

uint32_t crc32c(const void* data, size_t n) {
  boost::crc_optimal<32, 0x1EDC6F41, 0xFFFFFFFF, 0xFFFFFFFF, true, true> crc;
  crc.process_bytes(data, n);
  return crc.checksum();
}

uint32_t masked_crc32c(const void* data, size_t n) {
  const uint32_t c = crc32c(data, n);
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

std::string tfrecord_frame(std::string_view data) {
  std::string out;
  out.reserve(data.size() + 16);
  put_le(out, data.size(), 8);
  put_le(out, masked_crc32c(out.data(), 8), 4);
  out.append(data);
  put_le(out, masked_crc32c(data.data(), data.size()), 4);
  return out;
}

TFRecords read_tfrecords(const std::string& path, bool allow_torn_tail) {
  std::ifstream in(path, std::ios::binary);
  AERIE_CHECK(in, "cannot read TFRecord file " << path << ": " << std::strerror(errno));
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  AERIE_CHECK(!in.bad(), "cannot read TFRecord file " << path << ": " << std::strerror(errno));
  TFRecords out;
  size_t pos = 0;
  while (pos < bytes.size()) {
    const size_t left = bytes.size() - pos;
    const char* p = bytes.data() + pos;
    uint64_t len = 0;
    bool whole = left >= 12;
    if (whole) {
      AERIE_CHECK(static_cast<uint32_t>(get_le(p + 8, 4)) == masked_crc32c(p, 8),
                  path << ": the length CRC of the record at byte " << pos << " does not match (not a TFRecord "
                       << "file, or damaged)");
      len = get_le(p, 8);
      whole = left >= 16 && len <= left - 16;
    }
    if (!whole) {
      AERIE_CHECK(allow_torn_tail, path << ": the file ends inside the record at byte " << pos << " (" << left
                                        << " bytes left; a writer killed mid-record?)");
      out.torn_tail_bytes = static_cast<int64_t>(left);
      break;
    }
    const char* data = p + 12;
    AERIE_CHECK(static_cast<uint32_t>(get_le(data + len, 4)) == masked_crc32c(data, len),
                path << ": the data CRC of the record at byte " << pos << " (" << len << " bytes) does not match");
    out.records.emplace_back(data, len);
    pos += 16 + len;
  }
  return out;
}

}  // namespace aerie
