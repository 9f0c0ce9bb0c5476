// safetensors files (https://github.com/huggingface/safetensors, format spec in its README):
// 8-byte little-endian header length, a JSON header {name: {dtype, shape, data_offsets}, "__metadata__":
// {str: str}}, then the raw little-endian tensor bytes.
#pragma once
#include <map>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace aerie {

struct SafetensorsFile {
  std::map<std::string, Tensor> tensors;           // CPU tensors, dtype as stored
  std::map<std::string, std::string> metadata;     // "__metadata__"
};

/// Reads a whole file. Supports F32, BF16, F16, I32, I64, U8, BOOL (read as U8), F8_E4M3. Throws aerie::Error
/// naming the file and the tensor on a truncated file, bad JSON, unsupported dtype or bad offsets.
SafetensorsFile load_safetensors(const std::string& path);

/// Where one tensor lies in a safetensors file.
struct SafetensorsEntry {
  DType dtype = DType::F32;
  Shape shape;
  uint64_t offset = 0;  // absolute byte offset of the data in the file
  uint64_t nbytes = 0;
};

/// A safetensors file whose header is read (and checked, as load_safetensors does) at construction
/// and whose tensors are read one at a time: a checkpoint shard of many GB need not be held in memory
/// whole. Throws aerie::Error naming the file and the tensor, as load_safetensors.
class SafetensorsReader {
 public:
  explicit SafetensorsReader(const std::string& path);
  /// A reader of `entries` without a file (a tensor list: names, dtypes and shapes only; the memory
  /// plan's checkpoint, model/plan_source.h). `label` names it in messages; reading a tensor throws.
  static SafetensorsReader listing(const std::string& label, std::map<std::string, SafetensorsEntry> entries);
  /// False for a listing().
  bool has_data() const { return !listing_; }
  const std::string& path() const { return path_; }
  const std::map<std::string, SafetensorsEntry>& entries() const { return entries_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  bool contains(const std::string& name) const { return entries_.count(name) > 0; }
  /// The whole tensor, dtype as stored. Throws naming the file if `name` is absent.
  Tensor read(const std::string& name) const;
  /// Rows [begin, end) along dim 0 (a tensor-parallel shard of a weight), dtype as stored.
  Tensor read_rows(const std::string& name, int64_t begin, int64_t end) const;
  /// Columns [begin, end) along dim 1 of a 2-D tensor (a row-parallel linear's shard), dtype as
  /// stored: one read per row of (end - begin) elements, so only the slice's bytes are read. Throws
  /// naming the file and tensor if `name` is absent, not 2-D, or the range is out of bounds.
  Tensor read_cols(const std::string& name, int64_t begin, int64_t end) const;

 private:
  SafetensorsReader() = default;
  /// Throws for a listing (no data to read `name` from).
  void check_data(const std::string& name) const;
  std::string path_;
  bool listing_ = false;
  std::map<std::string, SafetensorsEntry> entries_;
  std::map<std::string, std::string> metadata_;
};

/// Writes `file` atomically: to `tmp` ("<path>.tmp" when empty; a job's --output: unique_tmp_path(path),
/// io/output_lock.h), fsync, then rename. BOOL is written for tensors named in `bool_tensors` (U8 data),
/// e.g. t2d. Throws aerie::Error on I/O failure.
void save_safetensors(const std::string& path, const SafetensorsFile& file,
                      const std::vector<std::string>& bool_tensors = {}, const std::string& tmp = "");

}  // namespace aerie
