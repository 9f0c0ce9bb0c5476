// safetensors files (https://github.com/huggingface/safetensors, format spec in its README):
// 8-byte little-endian header length, a JSON header {name: {dtype, shape, data_offsets}, "__metadata__":
// {str: str}}, then the raw little-endian tensor bytes.
#pragma once
#include <map>
#include <string>

#include "core/tensor.h"

namespace aerie {

struct SafetensorsFile {
  std::map<std::string, Tensor> tensors;           // CPU tensors, dtype as stored
  std::map<std::string, std::string> metadata;     // "__metadata__"
};

/// Reads a whole file. Supports F32, BF16, I32, I64, U8, BOOL (read as U8). Throws aerie::Error
/// naming the file and the tensor on a truncated file, bad JSON, unsupported dtype or bad offsets.
SafetensorsFile load_safetensors(const std::string& path);

/// Writes `file` atomically: to "<path>.tmp", fsync, then rename. BOOL is written for tensors named
/// in `bool_tensors` (U8 data), e.g. t2d. Throws aerie::Error on I/O failure.
void save_safetensors(const std::string& path, const SafetensorsFile& file,
                      const std::vector<std::string>& bool_tensors = {});

}  // namespace aerie
