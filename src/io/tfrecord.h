// TFRecord framing, the container of TensorBoard event files (tensorflow/core/lib/io/record_writer.cc).
// A file is a sequence of records, each
//   uint64 length (little endian) | uint32 masked_crc32c(length bytes) | data | uint32 masked_crc32c(data)
// where masked_crc32c(x) = ((c >> 15) | (c << 17)) + 0xa282ead8 with c = CRC-32C (Castagnoli) of x.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace aerie {

/// CRC-32C (Castagnoli polynomial 0x1EDC6F41, reflected, init and final xor 0xFFFFFFFF) of n bytes
/// (Boost.CRC). crc32c("123456789") = 0xE3069283.
uint32_t crc32c(const void* data, size_t n);

/// TFRecord's masked CRC: ((c >> 15) | (c << 17)) + 0xa282ead8 with c = crc32c(data, n).
uint32_t masked_crc32c(const void* data, size_t n);

/// One record of `data`, framed as above (16 bytes longer than data).
std::string tfrecord_frame(std::string_view data);

/// The records of a TFRecord file, in order.
struct TFRecords {
  std::vector<std::string> records;
  /// Bytes at the end that do not make a whole record (a writer killed mid-record); only with
  /// allow_torn_tail, else read_tfrecords throws.
  int64_t torn_tail_bytes = 0;
};

/// Reads every record of `path`, checking both CRCs of each. Throws aerie::Error naming the file and the
/// byte offset of the record when the file cannot be read, a CRC does not match, or (unless
/// allow_torn_tail) the file ends inside a record.
TFRecords read_tfrecords(const std::string& path, bool allow_torn_tail = false);

}  // namespace aerie
